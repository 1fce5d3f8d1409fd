"""Aggregation math: pure functions of stacked client tensors.

Inputs are ``Tensor[m, d]`` (one row per selected client) or a dict of per-layer
``Tensor[m, ...]``; outputs are tensors. No models, no loops over clients, any device.
"""

from .afl import afl_direction, afl_lambda_step, project_simplex
from .conflict import config_direction, fedfv_direction, fedfv_kept, qfedavg_step
from .craft import craft_direction, gram_pinv_apply, pinv_solve
from .dac import dac_probabilities, dac_tau_schedule, dac_update_similarities
from .fedavg import count_conflicts, fedavg
from .feddyn import feddyn_client_update, feddyn_server_update
from .fedlf import fedlf_direction, min_norm_point
from .fednova import fednova_aggregate, fednova_norms, fednova_tau_eff
from .fedoui import beta_moments, empirical_rank_scores, fedalign_weights, fedoui_scores, fedoui_weights, fit_beta
from .fedvg import fedvg_aggregate, fedvg_layerwise_weights, fedvg_mixed_weights, fedvg_weights
from .gossip import (
    gossip_mix,
    is_connected,
    metropolis_hastings_weights,
    neighbour_average_matrix,
    random_graph,
    sample_neighbours,
)
from .robust import (
    bulyan,
    bulyan_select,
    centered_clipping,
    coordinate_median,
    geometric_median,
    krum,
    krum_scores,
    krum_select,
    max_bulyan_f,
    max_krum_f,
    norm_clip,
    pairwise_sq_distances,
    trimmed_mean,
    update_norms,
)
from .scaffold import scaffold_control_update, scaffold_server_update

__all__ = [
    "fedavg",
    "count_conflicts",
    "craft_direction",
    "pinv_solve",
    "gram_pinv_apply",
    "config_direction",
    "fedfv_direction",
    "fedfv_kept",
    "qfedavg_step",
    "fedvg_weights",
    "fedvg_layerwise_weights",
    "fedvg_mixed_weights",
    "fedvg_aggregate",
    "fit_beta",
    "beta_moments",
    "empirical_rank_scores",
    "fedoui_scores",
    "fedoui_weights",
    "fedalign_weights",
    "scaffold_control_update",
    "scaffold_server_update",
    "feddyn_client_update",
    "feddyn_server_update",
    "fednova_norms",
    "fednova_tau_eff",
    "fednova_aggregate",
    "project_simplex",
    "afl_lambda_step",
    "afl_direction",
    "min_norm_point",
    "fedlf_direction",
    "random_graph",
    "is_connected",
    "metropolis_hastings_weights",
    "gossip_mix",
    "sample_neighbours",
    "neighbour_average_matrix",
    "dac_probabilities",
    "dac_update_similarities",
    "dac_tau_schedule",
    "coordinate_median",
    "trimmed_mean",
    "pairwise_sq_distances",
    "krum_scores",
    "krum_select",
    "krum",
    "max_krum_f",
    "bulyan_select",
    "bulyan",
    "max_bulyan_f",
    "geometric_median",
    "centered_clipping",
    "norm_clip",
    "update_norms",
]

"""Aggregation math: pure functions of stacked client tensors.

Inputs are ``Tensor[m, d]`` (one row per selected client) or a dict of per-layer
``Tensor[m, ...]``; outputs are tensors. No models, no loops over clients, any device.
"""

from .conflict import config_direction, fedfv_direction, fedfv_kept, qfedavg_step
from .craft import craft_direction, gram_pinv_apply, pinv_solve
from .fedavg import count_conflicts, fedavg
from .fedoui import beta_moments, empirical_rank_scores, fedalign_weights, fedoui_scores, fedoui_weights, fit_beta
from .fedvg import fedvg_aggregate, fedvg_layerwise_weights, fedvg_mixed_weights, fedvg_weights

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
]

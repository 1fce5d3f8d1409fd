"""Property test: random malformed inputs to the public aggregators and partitions.

Every call either returns a result or raises ``ValueError``/``TypeError`` whose message
names the argument that was spoiled; never a NumPy/torch internal error, a hang or a
crash of another kind.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedlearn_edu import aggregators as agg
from fedlearn_edu.data import partition as part

M, D = 4, 6


def _valid():
    """Valid arguments of every function under test: ``{name: (function, {arg: value})}``."""
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(M, D, generator=g)
    layered = {"a.weight": torch.randn(M, 2, 3, generator=g), "a.bias": torch.randn(M, 2, generator=g)}
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    losses = torch.tensor([0.5, 1.0, 1.5, 2.0])
    oui = torch.tensor([0.2, 0.4, 0.5, 0.7])
    labels = np.repeat(np.arange(4), 10)
    return {
        "fedavg": (agg.fedavg, {"deltas": deltas, "weights": w}),
        "count_conflicts": (agg.count_conflicts, {"deltas": deltas, "update": deltas[0]}),
        "craft_direction": (agg.craft_direction, {"pseudo_grads": deltas, "rho": w, "rcond": None}),
        "craft_direction_layers": (agg.craft_direction, {"pseudo_grads": layered, "rho": w}),
        "pinv_solve": (agg.pinv_solve, {"matrix": deltas, "r": w, "rcond": None}),
        "config_direction": (agg.config_direction, {"pseudo_grads": deltas, "rcond": None}),
        "fedfv_direction": (agg.fedfv_direction, {"pseudo_grads": deltas, "losses": losses, "alpha": 0.1}),
        "fedfv_kept": (agg.fedfv_kept, {"losses": losses, "alpha": 0.5}),
        "qfedavg_step": (agg.qfedavg_step, {"pseudo_grads": deltas, "losses": losses, "lr": 0.1, "q": 1.0}),
        "fedvg_weights": (agg.fedvg_weights, {"grad_norms": w, "eps": 1e-8}),
        "fedvg_layerwise_weights": (agg.fedvg_layerwise_weights, {"grad_norms": w.view(M, 1), "eps": 1e-8}),
        "fedvg_mixed_weights": (agg.fedvg_mixed_weights, {"weights": w / w.sum(), "num_samples": w}),
        "fedvg_aggregate": (agg.fedvg_aggregate, {"deltas": layered, "weights": w / w.sum()}),
        "fit_beta": (agg.fit_beta, {"oui_values": oui, "clip": 1e-3}),
        "beta_moments": (agg.beta_moments, {"mean": 0.4, "var": 0.01}),
        "empirical_rank_scores": (agg.empirical_rank_scores, {"oui_values": oui}),
        "fedoui_scores": (agg.fedoui_scores, {"oui_values": oui}),
        "fedoui_weights": (agg.fedoui_weights, {"oui_values": oui, "num_samples": w, "eps": 1e-3}),
        "fedalign_weights": (agg.fedalign_weights, {"deltas": deltas, "num_samples": w, "eps": 1e-3}),
        "iid_partition": (part.iid_partition, {"num_samples_or_labels": 40, "num_clients": 4, "seed": 0}),
        "dirichlet_partition": (
            part.dirichlet_partition,
            {"labels": labels, "num_clients": 4, "alpha": 0.5, "min_size": 2, "seed": 0, "max_tries": 5},
        ),
        "shard_partition": (
            part.shard_partition,
            {"labels": labels, "num_clients": 4, "shards_per_client": 2, "seed": 0},
        ),
        "quantity_skew_partition": (
            part.quantity_skew_partition,
            {"num_samples": 40, "num_clients": 4, "sigma": 1.0, "min_size": 2, "seed": 0},
        ),
        "partition_label_counts": (
            part.partition_label_counts,
            {"labels": labels, "partition": [np.arange(0, 20), np.arange(20, 40)], "num_classes": 4},
        ),
    }


VALID = _valid()

_bad_scalars = st.sampled_from(
    [None, "1", "abc", b"x", True, math.nan, math.inf, -math.inf, -1, -1.5, 0, 1e308, 2.5, 10**30, [], {}, object()]
)


@st.composite
def _bad_tensors(draw):
    kind = draw(
        st.sampled_from(["nan", "inf", "int", "bool", "empty", "shape", "scalar", "list", "f16", "neg", "huge"])
    )
    m = draw(st.sampled_from([M, 1, 3]))
    if kind == "nan":
        t = torch.rand(m, D)
        t[draw(st.integers(0, m - 1)), 0] = math.nan
        return t
    if kind == "inf":
        return torch.full((m,), math.inf)
    if kind == "int":
        return torch.ones(m, D, dtype=torch.int64)
    if kind == "bool":
        return torch.ones(m, dtype=torch.bool)
    if kind == "empty":
        return torch.zeros(0, D)
    if kind == "shape":
        return torch.rand(*draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    if kind == "scalar":
        return torch.tensor(0.5)
    if kind == "list":
        return draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6))
    if kind == "f16":
        return torch.rand(m, D, dtype=torch.float16)
    if kind == "neg":
        return -torch.rand(m)
    return torch.full((m,), 3e38)


_bad_dicts = st.sampled_from(
    [{"a": "x"}, {"a": torch.rand(M, 2), "b": torch.rand(M + 1, 2)}, {"a": torch.rand(M, 2, dtype=torch.float64)}]
)
_malformed = st.one_of(_bad_scalars, _bad_tensors(), _bad_dicts)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(VALID)), data=st.data())
def test_malformed_inputs_give_a_result_or_an_error_naming_the_argument(name, data):
    fn, args = VALID[name]
    spoiled = data.draw(st.sampled_from(sorted(args)), label="argument")
    value = data.draw(_malformed, label="value")
    kwargs = {**args, spoiled: value}
    try:
        fn(**kwargs)
    except (ValueError, TypeError) as err:
        message = str(err)
        named = [a for a in args if a in message]
        assert spoiled in message or named, f"{name}({spoiled}={value!r}) raised {type(err).__name__}: {message}"
    # any other exception type fails the test (hypothesis reports the input)


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_valid_arguments_work(name):
    fn, args = VALID[name]
    fn(**args)

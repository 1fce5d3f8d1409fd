"""The aggregation functions' explicit ``check=`` (scikit-learn's ``check_input``), not a hidden context.

The round driver scans the updates once (its bad-client policy) and then passes ``check=False``;
before, a ``ContextVar`` keyed on ``id()`` and ``tensor._version`` (``checks.known_finite``)
told ``check_updates`` which tensors to skip.
"""

import inspect

import pytest
import torch

from fedlearn_edu import aggregators as agg
from fedlearn_edu import checks

M = 7
W = torch.arange(1.0, M + 1)

# name -> a call on finite updates ``d`` (``{name: Tensor[M, ...]}``), forwarding check=
CALLS = {
    "fedavg": lambda d, **kw: agg.fedavg(d, W, **kw),
    "count_conflicts": lambda d, **kw: agg.count_conflicts(d, {k: v[0] for k, v in d.items()}, **kw),
    "afl_direction": lambda d, **kw: agg.afl_direction(d, W / W.sum(), **kw),
    "fedalign_weights": lambda d, **kw: agg.fedalign_weights(d, W, **kw),
    "fedvg_aggregate": lambda d, **kw: agg.fedvg_aggregate(d, W / W.sum(), **kw),
    "feddyn_server_update": lambda d, **kw: agg.feddyn_server_update(
        d, {k: torch.ones_like(v[0]) for k, v in d.items()}, 0.1, 10, **kw
    ),
    "fednova_aggregate": lambda d, **kw: agg.fednova_aggregate(d, torch.arange(1, M + 1), W, **kw),
    "scaffold_server_update": lambda d, **kw: agg.scaffold_server_update(
        d,
        {k: torch.full_like(v, 0.5) for k, v in d.items()},
        {k: torch.zeros_like(v[0]) for k, v in d.items()},
        10,
        **kw,
    ),
    "coordinate_median": lambda d, **kw: agg.coordinate_median(d, **kw),
    "trimmed_mean": lambda d, **kw: agg.trimmed_mean(d, 0.2, **kw),
    "pairwise_sq_distances": lambda d, **kw: agg.pairwise_sq_distances(d, **kw),
    "krum_scores": lambda d, **kw: agg.krum_scores(d, 1, **kw),
    "krum_select": lambda d, **kw: agg.krum_select(d, 1, 2, **kw),
    "krum": lambda d, **kw: agg.krum(d, 1, 2, **kw),
    "bulyan_select": lambda d, **kw: agg.bulyan_select(d, 1, **kw),
    "bulyan": lambda d, **kw: agg.bulyan(d, 1, **kw),
    "update_norms": lambda d, **kw: agg.update_norms(d, **kw),
    "norm_clip": lambda d, **kw: agg.norm_clip(d, 0.5, **kw),
    "geometric_median": lambda d, **kw: agg.geometric_median(d, W, **kw),
    "centered_clipping": lambda d, **kw: agg.centered_clipping(d, 0.5, 2, **kw),
    "config_direction": lambda d, **kw: agg.config_direction(d, **kw),
    "fedfv_direction": lambda d, **kw: agg.fedfv_direction(d, W, **kw),
    "qfedavg_step": lambda d, **kw: agg.qfedavg_step(d, W, 0.1, **kw),
    "fedlf_direction": lambda d, **kw: agg.fedlf_direction(d, W, **kw),
    "gossip_mix": lambda d, **kw: agg.gossip_mix(d, torch.full((M, M), 1.0 / M), **kw),
}


def _updates(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(M, 3, 2, generator=g), "b": torch.randn(M, 2, generator=g)}


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _leaves(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _leaves(v)]
    return [torch.tensor(out)]


def test_the_hidden_context_is_gone():
    assert not hasattr(checks, "known_finite") and not hasattr(checks, "_KNOWN_FINITE")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_check_is_an_explicit_keyword_and_changes_no_number(name):
    """Every aggregation function that scans the updates takes ``check=True`` (keyword only);
    with finite updates ``check=False`` gives the same result, bit for bit."""
    parameter = inspect.signature(getattr(agg, name)).parameters["check"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is True
    d = _updates()
    for a, b in zip(_leaves(CALLS[name](d)), _leaves(CALLS[name](d, check=False)), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("name", sorted(CALLS))
def test_check_false_skips_only_the_nan_scan(name):
    """``check=True`` names the client with NaN; ``check=False`` trusts the caller's scan (no error
    about the values) but still refuses malformed updates."""
    d = _updates()
    d["b"][3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"row 3 of the stacked updates contains NaN"):
        CALLS[name](d)
    try:
        CALLS[name](d, check=False)
    except ValueError as err:  # a later step may still trip on the NaN, but not the scan
        assert "of the stacked updates contains NaN" not in str(err), name
    with pytest.raises(TypeError, match="floating-point"):
        CALLS[name]({"w": torch.ones(M, 3, 2, dtype=torch.long), "b": torch.ones(M, 2)}, check=False)

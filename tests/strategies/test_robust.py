"""The robust aggregation strategies (:mod:`fedlearn_edu.strategies.robust`) on the round driver: both engines,
any server optimizer, the rules' math."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlearn_edu import (
    Bulyan,
    CenteredClipping,
    GeometricMedian,
    Krum,
    Median,
    MultiKrum,
    NormClipping,
    TrimmedMean,
    federated_dataset,
    make_model,
    make_strategy,
    simulate,
)
from fedlearn_edu.aggregators import bulyan, centered_clipping, coordinate_median, fedavg, krum, norm_clip
from fedlearn_edu.params import layer_groups
from fedlearn_edu.strategies import ClientUpdates, ServerAdam

KW = dict(rounds=2, clients_per_round=7, lr=0.1, batch_size=16, progress=False, seed=3, device="cpu")
MAKERS = {
    "median": Median,
    "trimmedmean": lambda: TrimmedMean(0.2),
    "krum": Krum,
    "multikrum": lambda: MultiKrum(f=1, k=3),
    "bulyan": Bulyan,
    "geometricmedian": GeometricMedian,
    "centeredclipping": lambda: CenteredClipping(tau=0.5, iterations=2),
    "normclipping": lambda: NormClipping(0.5),
    "median_adam": lambda: Median(optimizer=ServerAdam(0.01)),
    "krum_layerwise": lambda: Krum(layerwise=True),
    "cclip_layerwise": lambda: CenteredClipping(tau=0.2, layerwise=True),
}


@pytest.fixture(scope="module")
def fed():
    return federated_dataset("digits", num_clients=8, alpha=0.5, seed=0)


def _model(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)


def test_registered_by_name():
    for name in ("median", "trimmedmean", "krum", "multikrum", "bulyan", "geometricmedian", "centeredclipping"):
        assert make_strategy(name).name == name
    assert make_strategy("norm-clipping", clip=2.0).clip == 2.0


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_loop_and_vmap_engines_give_the_same_run(fed, name):
    a = simulate(fed, _model(fed), MAKERS[name](), engine="loop", **KW)
    b = simulate(fed, _model(fed), MAKERS[name](), engine="vmap", **KW)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a.client_accuracy, b.client_accuracy, atol=1e-6)
    for da, db in zip(a.diagnostics, b.diagnostics):
        if "selected" in da and isinstance(da["selected"], torch.Tensor):
            assert torch.equal(da["selected"], db["selected"])
    assert any(not torch.equal(a.final_params[k], _model(fed).state_dict()[k]) for k in a.final_params)


def _updates(m=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    deltas = {"fc.weight": torch.randn(m, 3, 2, generator=g), "fc.bias": torch.randn(m, 3, generator=g)}
    deltas["out.weight"] = torch.randn(m, 2, 3, generator=g)
    ids = torch.arange(10, 10 + m)
    return ClientUpdates(1, ids, deltas, torch.arange(1, m + 1) * 5, torch.zeros(m), None)


def _state(updates):
    params = {k: torch.zeros(v.shape[1:]) for k, v in updates.deltas.items()}
    return params


@pytest.mark.parametrize(
    "strategy, rule",
    [
        (Median(), lambda d, u: coordinate_median(d)),
        (Krum(f=2), lambda d, u: krum(d, 2)),
        (MultiKrum(f=1), lambda d, u: krum(d, 1, 6)),  # k = m - f
        (Bulyan(), lambda d, u: bulyan(d, 1)),  # f = floor((7 - 3) / 4)
        (NormClipping(0.5), lambda d, u: fedavg(norm_clip(d, 0.5)[0], u.size_weights)),
        (NormClipping(0.5, weighting="uniform"), lambda d, u: fedavg(norm_clip(d, 0.5)[0], torch.ones(7))),
    ],
)
def test_the_step_is_the_rules_aggregate(strategy, rule):
    u = _updates()
    params = _state(u)
    state, _ = strategy.init_state(params, None, 20, 0)
    new, diag = strategy.aggregate(state, u)
    expected = rule(u.deltas, u)
    for k in params:
        torch.testing.assert_close(new["params"][k], expected[k], rtol=0, atol=1e-6)
    if isinstance(strategy, Krum) and not isinstance(strategy, MultiKrum):
        (i,) = diag["selected"].tolist()
        assert all(torch.equal(new["params"][k], u.deltas[k][i - 10]) for k in params)


def test_centered_clipping_keeps_its_centre_in_the_server_state():
    u1, u2 = _updates(seed=1), _updates(seed=2)
    s = CenteredClipping(tau=0.3, iterations=2)
    state, _ = s.init_state(_state(u1), None, 20, 0)
    assert all(not bool(v.any()) for v in state["center"].values())
    s1, _ = s.aggregate(state, u1)
    v1 = centered_clipping(u1.deltas, 0.3, 2)
    s2, _ = s.aggregate(s1, u2)
    v2 = centered_clipping(u2.deltas, 0.3, 2, v1)
    for k in v1:
        torch.testing.assert_close(s1["center"][k], v1[k])
        torch.testing.assert_close(s2["center"][k], v2[k])
        torch.testing.assert_close(s2["params"][k], v1[k] + v2[k])


def test_layerwise_krum_picks_per_layer_group():
    u = _updates(seed=4)
    new, diag = Krum(f=1, layerwise=True).aggregate(Krum().init_state(_state(u), None, 20, 0)[0], u)
    groups = layer_groups(list(u.deltas))
    assert set(diag["selected"]) == set(groups)
    for group, names in groups.items():
        (i,) = diag["selected"][group].tolist()
        sub = {k: u.deltas[k] for k in names}
        for k in names:
            assert torch.equal(new["params"][k], krum(sub, 1)[k])
            assert torch.equal(new["params"][k], u.deltas[k][i - 10])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"beta must be in \[0, 0.5\)"):
        TrimmedMean(0.5)
    with pytest.raises(ValueError, match="f must be >= 0"):
        Krum(f=-1)
    with pytest.raises(ValueError, match="weighting must be one of"):
        GeometricMedian(weighting="n")
    with pytest.raises(ValueError, match="clip must be > 0"):
        NormClipping(0)
    u = _updates()
    with pytest.raises(ValueError, match=r"Bulyan needs 4f \+ 3 <= m.*f=2 with m=7"):
        Bulyan(f=2).aggregate(Bulyan().init_state(_state(u), None, 20, 0)[0], u)


@pytest.mark.parametrize("make", [Krum, MultiKrum, Bulyan, lambda: Krum(layerwise=True)])
def test_too_few_clients_per_round_names_them_and_the_minimum(fed, make):
    strategy = make()
    # was: "f must be >= 0, got -1." though f was never given
    with pytest.raises(ValueError, match=rf"^{type(strategy).__name__} needs at least 3 clients per round .*, got 2: "):
        simulate(fed, _model(fed), strategy, **{**KW, "clients_per_round": 2, "rounds": 1})
    u = _updates(m=2)
    with pytest.raises(ValueError, match=r"needs at least 3 clients per round \(f = 0 faulty\), got 2"):
        strategy.aggregate(strategy.init_state(_state(u), None, 20, 0)[0], u)
    # with f given, too large for m, the aggregator names f and m (unchanged)
    with pytest.raises(ValueError, match=r"got f=1 with m=2.*select at least 3 clients"):
        type(strategy)(f=1).aggregate(strategy.init_state(_state(u), None, 20, 0)[0], u)

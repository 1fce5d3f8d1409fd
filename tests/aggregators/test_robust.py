"""Robust aggregation rules: equal to Flower's on identical inputs (or different as stated); defining properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlearn_edu.aggregators import (
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
    trimmed_mean,
    update_norms,
)


def _updates(m: int, seed: int = 0, dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(m, 3, 4, generator=g, dtype=dtype),
        "fc.bias": torch.randn(m, 3, generator=g, dtype=dtype),
        "out.weight": torch.randn(m, 2, 3, generator=g, dtype=dtype),
    }


def _flower_results(deltas: dict, num_examples=None) -> list:
    """Flower's input layout: one (list of ndarrays, num_examples) per client."""
    m = next(iter(deltas.values())).shape[0]
    n = [1] * m if num_examples is None else list(num_examples)
    return [([v[i].numpy().copy() for v in deltas.values()], n[i]) for i in range(m)]


def _close(ours: dict, theirs: list, atol=1e-12) -> None:
    assert len(ours) == len(theirs)
    for (k, v), w in zip(ours.items(), theirs):
        np.testing.assert_allclose(v.numpy(), w, rtol=0, atol=atol, err_msg=k)


def _flat(tree) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in tree.values()]) if isinstance(tree, dict) else tree


# --------------------------------------------------------------------------- Flower equality
@pytest.mark.parametrize("m", [5, 6, 11])
def test_median_equals_flower(m):
    agg = pytest.importorskip("flwr.server.strategy.aggregate")
    d = _updates(m, seed=m)
    _close(coordinate_median(d), agg.aggregate_median(_flower_results(d)), atol=0)


@pytest.mark.parametrize("m, beta", [(5, 0.0), (10, 0.1), (10, 0.25), (11, 0.3), (7, 0.49)])
def test_trimmed_mean_equals_flower(m, beta):
    agg = pytest.importorskip("flwr.server.strategy.aggregate")
    d = _updates(m, seed=m)
    _close(trimmed_mean(d, beta), agg.aggregate_trimmed_avg(_flower_results(d), beta))


@pytest.mark.parametrize("m, f", [(5, 0), (5, 1), (10, 2), (10, 3), (12, 4)])
def test_krum_equals_flower(m, f):
    agg = pytest.importorskip("flwr.server.strategy.aggregate")
    d = _updates(m, seed=10 * m + f)
    _close(krum(d, f), agg.aggregate_krum(_flower_results(d), f, 0), atol=0)


@pytest.mark.parametrize("m, f, k", [(10, 2, 3), (10, 1, 6), (7, 2, 2)])
def test_multikrum_equals_flower_with_equal_sizes_and_with_its_size_weights(m, f, k):
    """Flower's Multi-Krum is the mean of the k selected *weighted by their numbers of examples*;
    ours is the plain mean (Blanchard et al.), or Flower's with ``weights=n``. They differ when
    the selected clients' sizes differ."""
    agg = pytest.importorskip("flwr.server.strategy.aggregate")
    d = _updates(m, seed=m + k)
    _close(krum(d, f, k), agg.aggregate_krum(_flower_results(d), f, k))
    n = torch.arange(1, m + 1) ** 2
    flower = agg.aggregate_krum(_flower_results(d, n.tolist()), f, k)
    _close(krum(d, f, k, weights=n), flower)
    plain = krum(d, f, k)
    assert max(float(np.abs(plain[key].numpy() - w).max()) for key, w in zip(plain, flower)) > 1e-3


@pytest.mark.parametrize("m, f", [(3, 0), (7, 1), (11, 2), (12, 2), (15, 3)])
def test_bulyan_equals_flower(m, f):
    agg = pytest.importorskip("flwr.server.strategy.aggregate")
    d = _updates(m, seed=100 + m)
    results = _flower_results(d)
    theirs = agg.aggregate_bulyan(results, f, agg.aggregate_krum, to_keep=0)
    _close(bulyan(d, f), theirs)


def test_krum_on_models_equals_krum_on_updates():
    """Flower runs the rules on the clients' models, we on their updates theta_i - theta_t: Krum,
    Bulyan and the coordinate-wise rules commute with the shift by theta_t."""
    d = _updates(9, seed=3)
    theta = {k: torch.randn(v.shape[1:], dtype=v.dtype) for k, v in d.items()}
    models = {k: v + theta[k] for k, v in d.items()}
    assert torch.equal(krum_select(models, 2, 3), krum_select(d, 2, 3))
    assert torch.equal(bulyan_select(models, 1), bulyan_select(d, 1))
    for rule in (lambda x: coordinate_median(x), lambda x: trimmed_mean(x, 0.2), lambda x: bulyan(x, 1)):
        a, b = rule(models), rule(d)
        for k in d:
            torch.testing.assert_close(a[k] - theta[k], b[k], rtol=0, atol=1e-12)


def test_krum_ties_go_to_the_lower_index():
    """Equal scores (duplicated updates): ours picks the lower index, deterministically."""
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [5.0, 5.0], [1.0, 0.0]])
    scores = krum_scores(x, 1)
    assert scores[0] == scores[1] == scores[2] == scores[4] < scores[3]
    assert krum_select(x, 1, 2).tolist() == [0, 1]
    assert krum_select(x, 1, 4).tolist() == [0, 1, 2, 4]
    assert torch.equal(krum(x, 1), x[0])


# --------------------------------------------------------------------------- defining properties
def test_median_numpy_and_breakdown():
    d = _updates(9, seed=1)
    ref = {k: torch.from_numpy(np.median(v.numpy(), axis=0)) for k, v in d.items()}
    med = coordinate_median(d)
    for k in d:
        assert torch.equal(med[k], ref[k])
    for moved in (1, 2, 3, 4):  # fewer than half the rows, moved arbitrarily far
        bad = {k: v.clone() for k, v in d.items()}
        g = torch.Generator().manual_seed(moved)
        for k in bad:
            bad[k][:moved] = 1e12 * torch.sign(torch.randn(bad[k][:moved].shape, generator=g, dtype=bad[k].dtype))
        out = coordinate_median(bad)
        lo = {k: v.min(0).values for k, v in d.items()}
        hi = {k: v.max(0).values for k, v in d.items()}
        for k in d:  # stays within the honest values' range per coordinate
            assert bool(((out[k] >= lo[k]) & (out[k] <= hi[k])).all())
    # half the rows moved: it breaks down
    bad = {k: v.clone() for k, v in d.items()}
    for k in bad:
        bad[k][:5] = 1e12
    assert float(_flat(coordinate_median(bad)).abs().max()) > 1e11


def test_trimmed_mean_matches_scipy_and_beta_zero_is_the_mean():
    stats = pytest.importorskip("scipy.stats")
    d = _updates(10, seed=2)
    for beta in (0.0, 0.1, 0.2, 0.35):
        out = trimmed_mean(d, beta)
        for k, v in d.items():
            np.testing.assert_allclose(out[k].numpy(), stats.trim_mean(v.numpy(), beta, axis=0), rtol=0, atol=1e-12)
    out = trimmed_mean(d, 0.0)
    for k, v in d.items():
        torch.testing.assert_close(out[k], v.mean(0), rtol=0, atol=1e-15)
    # b < m/2 honest-majority bound: with b attackers trimmed, the result is in the honest range
    bad = {k: v.clone() for k, v in d.items()}
    for k in bad:
        bad[k][:2] = -1e9
    out = trimmed_mean(bad, 0.2)
    for k, v in d.items():
        assert bool((out[k] >= v[2:].min(0).values).all() and (out[k] <= v[2:].max(0).values).all())


@pytest.mark.parametrize(
    "rule",
    [
        lambda d: coordinate_median(d),
        lambda d: trimmed_mean(d, 0.2),
        lambda d: krum(d, 2),
        lambda d: krum(d, 2, 4),
        lambda d: geometric_median(d, iterations=500, ftol=0)[0],
        lambda d: centered_clipping(d, 0.5, 3),
        lambda d: centered_clipping(d, 0.5, 3, v={k: torch.ones(v.shape[1:], dtype=v.dtype) for k, v in d.items()}),
    ],
    ids=["median", "trimmed", "krum", "multikrum", "geomed", "cclip", "cclip_v"],
)
def test_every_rule_is_permutation_invariant(rule):
    d = _updates(9, seed=4)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    a, b = rule(d), rule({k: v[perm] for k, v in d.items()})
    for k in d:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-10)


def test_bulyan_is_permutation_invariant_unless_krum_scores_tie():
    """Bulyan's repeated Krum ends on r = 2f + 1 updates with max(1, f - 1) neighbours: with one
    neighbour (f <= 2), two mutual nearest neighbours have equal scores and the lower index is
    taken (as Flower), so the selected set -- and the result -- can depend on the clients' order.
    From f = 3 on every step has >= 2 neighbours and generic updates give no ties."""
    d = _updates(15, seed=4)
    perm = torch.randperm(15, generator=torch.Generator().manual_seed(0))
    a, b = bulyan(d, 3), bulyan({k: v[perm] for k, v in d.items()}, 3)
    for k in d:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-12)
    d = _updates(9, seed=4)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    chosen = set(bulyan_select(d, 1).tolist())
    permuted = set(perm[bulyan_select({k: v[perm] for k, v in d.items()}, 1)].tolist())
    assert chosen != permuted  # a tie in the last step (r = 3, one neighbour) went another way


def test_norm_clip_is_permutation_equivariant_and_bounded():
    d = _updates(7, seed=5)
    clipped, factors = norm_clip(d, 2.0)
    assert bool((update_norms(clipped) <= 2.0 * (1 + 1e-12)).all())
    norms = update_norms(d)
    torch.testing.assert_close(factors, torch.clamp(2.0 / norms, max=1.0))
    small, f_small = norm_clip(d, 1e6)  # nothing clipped: unchanged
    assert bool((f_small == 1).all()) and all(torch.equal(small[k], d[k]) for k in d)
    perm = torch.tensor([3, 1, 0, 6, 5, 2, 4])
    p, _ = norm_clip({k: v[perm] for k, v in d.items()}, 2.0)
    for k in d:
        assert torch.equal(p[k], clipped[k][perm])
    zero, fz = norm_clip(torch.zeros(3, 4), 1.0)  # a zero update stays zero (no 0/0)
    assert torch.equal(zero, torch.zeros(3, 4)) and bool((fz == 1).all())


def test_krum_picks_one_clients_own_update_and_resists_outliers():
    d = _updates(10, seed=6)
    for f in range(max_krum_f(10) + 1):
        out = krum(d, f)
        i = int(krum_select(d, f)[0])
        assert all(torch.equal(out[k], d[k][i]) for k in d)
    # brute-force scores
    x = _flat_rows(d)
    dist = ((x[:, None] - x[None]) ** 2).sum(-1)
    for f in (0, 2, 3):
        ref = [sorted(dist[i, j].item() for j in range(10) if j != i)[: 10 - f - 2] for i in range(10)]
        torch.testing.assert_close(krum_scores(d, f), torch.tensor([sum(r) for r in ref], dtype=torch.float64))
    # 3 far attackers among 10: Krum (f=3) never picks one
    bad = {k: v.clone() for k, v in d.items()}
    for k in bad:
        bad[k][7:] += 50.0
    assert int(krum_select(bad, 3)[0]) < 7 and bool((krum_select(bad, 3, 5) < 7).all())


def _flat_rows(d: dict) -> torch.Tensor:
    m = next(iter(d.values())).shape[0]
    return torch.cat([v.reshape(m, -1) for v in d.values()], dim=1)


def test_bulyan_resists_far_outliers_and_selects_theta():
    d = _updates(11, seed=7)
    assert len(bulyan_select(d, 2)) == 11 - 4 and len(set(bulyan_select(d, 2).tolist())) == 7
    bad = {k: v.clone() for k, v in d.items()}
    for k in bad:
        bad[k][:2] = 1e6
    out = bulyan(bad, 2)
    for k, v in d.items():
        assert bool((out[k] >= v[2:].min(0).values).all() and (out[k] <= v[2:].max(0).values).all())


def test_f_out_of_range_is_refused_clearly():
    d = _updates(6)
    assert max_krum_f(6) == 1 and max_bulyan_f(7) == 1 and max_bulyan_f(6) == 0
    with pytest.raises(ValueError, match=r"Krum needs 2f \+ 2 < m.*f=2 with m=6.*f <= 1"):
        krum(d, 2)
    with pytest.raises(ValueError, match=r"Bulyan needs 4f \+ 3 <= m.*f=1 with m=6.*f <= 0"):
        bulyan(d, 1)
    with pytest.raises(ValueError, match="f must be >= 0"):
        krum(d, -1)
    with pytest.raises(TypeError, match="f must be an integer"):
        krum(d, 1.0)
    with pytest.raises(ValueError, match="k must be <= 6"):
        krum(d, 1, 7)
    with pytest.raises(ValueError, match="Krum needs 2f"):
        krum(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 0.5\)"):
        trimmed_mean(d, 0.5)
    with pytest.raises(ValueError, match="clip must be > 0"):
        norm_clip(d, 0.0)
    with pytest.raises(ValueError, match="tau must be > 0"):
        centered_clipping(d, -1.0)
    with pytest.raises(ValueError, match="nu must be > 0"):
        geometric_median(d, nu=0)
    with pytest.raises(ValueError, match="contains NaN|NaN or Inf"):
        coordinate_median({"w": torch.tensor([[0.0], [float("nan")]])})


def test_geometric_median_is_the_fixed_point_and_matches_scipy():
    optimize = pytest.importorskip("scipy.optimize")
    x = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0], [5.0, 5.0], [1.0, 2.0]], dtype=torch.float64)
    alpha = torch.tensor([1.0, 2.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    z, steps = geometric_median(x, alpha, nu=1e-12, iterations=2000, ftol=1e-15)
    assert 1 < steps <= 2000
    # gradient of sum alpha_i ||z - x_i|| vanishes at z (no x_i coincides with it)
    diff = z - x
    grad = (alpha[:, None] * diff / diff.norm(dim=1, keepdim=True)).sum(0)
    assert float(grad.norm()) < 1e-6
    xa, aa = x.numpy(), alpha.numpy()
    obj = lambda p: float((aa * np.linalg.norm(xa - p, axis=1)).sum())  # noqa: E731
    ref = optimize.minimize(obj, x.mean(0).numpy(), method="Nelder-Mead", options=dict(xatol=1e-10, fatol=1e-12))
    np.testing.assert_allclose(z.numpy(), ref.x, atol=1e-6)
    assert obj(z.numpy()) <= ref.fun + 1e-10
    # dict input equals the flattened tensor input; the iteration count is returned
    d = _updates(8, seed=8)
    zd, sd = geometric_median(d, iterations=50)
    zf, sf = geometric_median(_flat_rows(d), iterations=50)
    torch.testing.assert_close(_flat(zd), zf, rtol=0, atol=1e-12)
    assert sd == sf and sd <= 50
    assert geometric_median(d, iterations=3, ftol=0)[1] == 3
    # robust: 3 of 8 rows moved far away, the median moves a bounded amount
    bad = {k: v.clone() for k, v in d.items()}
    for k in bad:
        bad[k][:3] += 1e6
    zb, _ = geometric_median(bad, iterations=500)
    assert float((_flat(zb) - _flat(zd)).norm()) < 10 * float(update_norms(d).max())


def test_centered_clipping_definition_and_limits():
    d = _updates(6, seed=9)
    x = _flat_rows(d)
    v = torch.zeros(x.shape[1], dtype=x.dtype)
    for _ in range(3):  # the definition, by hand
        diff = x - v
        v = v + (diff * torch.clamp(0.7 / diff.norm(dim=1, keepdim=True), max=1.0)).mean(0)
    torch.testing.assert_close(_flat(centered_clipping(d, 0.7, 3)), v, rtol=0, atol=1e-12)
    # a huge tau is the mean after one step
    torch.testing.assert_close(_flat(centered_clipping(d, 1e9, 1)), x.mean(0), rtol=0, atol=1e-12)
    # each step moves v by at most tau
    v0 = {k: torch.zeros(v.shape[1:], dtype=v.dtype) for k, v in d.items()}
    one = centered_clipping(d, 0.1, 1, v0)
    assert float(_flat(one).norm()) <= 0.1 + 1e-12
    with pytest.raises(ValueError, match="v must be shaped like one client's update"):
        centered_clipping(d, 1.0, 1, {k: torch.zeros(2) for k in d})


def test_inputs_are_not_modified_and_dtype_kept():
    d = _updates(7, seed=11, dtype=torch.float32)
    before = {k: v.clone() for k, v in d.items()}
    outs = [
        coordinate_median(d),
        trimmed_mean(d, 0.2),
        krum(d, 2),
        krum(d, 1, 3),
        bulyan(d, 1),
        geometric_median(d)[0],
        centered_clipping(d, 1.0, 2),
        norm_clip(d, 1.0)[0],
    ]
    for k in d:
        assert torch.equal(d[k], before[k])
    for out in outs:
        assert all(out[k].dtype == torch.float32 for k in d)


def test_an_f_too_large_for_m_names_the_clients_it_needs():
    d = _updates(6)
    # was: "... or select more clients." without saying how many
    with pytest.raises(ValueError, match=r"got f=2 with m=6: use f <= 1 or select at least 7 clients\.$"):
        krum(d, 2)
    with pytest.raises(ValueError, match=r"got f=1 with m=6: use f <= 0 or select at least 7 clients\.$"):
        bulyan(d, 1)
    with pytest.raises(ValueError, match=r"with m=2 clients: select at least 3 clients \(at least 5 with f=1\)\.$"):
        krum(torch.zeros(2, 3), 1)
    with pytest.raises(ValueError, match=r"with m=2: select at least 3 clients \(at least 11 with f=2\)\.$"):
        bulyan(torch.zeros(2, 3), 2)
    with pytest.raises(ValueError, match=r"with m=2 clients: select at least 3 clients\.$"):
        krum(torch.zeros(2, 3), 0)

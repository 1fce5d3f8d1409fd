"""The convergence module's math, tested as math.

Closed forms against an independent NumPy computation, bounds on random instances, the
estimators' unbiasedness by a statistical test with a fixed seed, their derived mean squared
errors against an exact enumeration of every sample.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlearn_edu import convergence as cv
from fedlearn_edu import quadratics as quad

DT = torch.float64


def _numpy_zeta2(grads: np.ndarray, p: np.ndarray) -> float:
    mean = (p[:, None] * grads).sum(0)
    return float(sum(pi * np.sum((g - mean) ** 2) for pi, g in zip(p, grads)))


@pytest.mark.parametrize("seed", range(3))
def test_dissimilarity_matches_numpy_and_the_closed_form(seed):
    rng = np.random.default_rng(seed)
    grads = rng.normal(size=(6, 4))
    w = rng.uniform(0.5, 3, size=6)
    got = cv.gradient_dissimilarity(torch.tensor(grads), torch.tensor(w))
    assert float(got) == pytest.approx(_numpy_zeta2(grads, w / w.sum()), rel=1e-12)
    A, b = quad.make_quadratics(5, 3, seed=seed)
    for x in (torch.zeros(3, dtype=DT), torch.tensor(rng.normal(size=3) * 5)):
        numpy_grads = np.einsum("ijk,ik->ij", A.numpy(), x.numpy()[None] - b.numpy())
        closed = cv.quadratic_dissimilarity(A, b, x, weights=torch.tensor(w[:5]))
        assert float(closed) == pytest.approx(_numpy_zeta2(numpy_grads, w[:5] / w[:5].sum()), rel=1e-9)


def test_dissimilarity_of_identical_clients_is_zero_and_equal_weights_default():
    g = torch.ones(4, 3, dtype=DT)
    assert float(cv.gradient_dissimilarity(g)) == 0.0
    with pytest.raises(ValueError, match="Tensor\\[N, d\\]"):
        cv.gradient_dissimilarity(torch.ones(3))
    with pytest.raises(ValueError, match="weights"):
        cv.gradient_dissimilarity(g, torch.tensor([1.0, -1.0, 1.0, 1.0]))


@pytest.mark.parametrize("seed", range(4))
def test_the_gb_bound_holds_everywhere_and_is_attained(seed):
    A, b = quad.make_quadratics(6, 3, seed=seed, condition=20.0)
    G2, B2 = cv.quadratic_gb(A, b)
    g = torch.Generator().manual_seed(seed)
    x_star = quad.global_optimum(A, b)
    for scale in (0.01, 1.0, 100.0):
        for _ in range(50):
            x = x_star + scale * torch.randn(3, generator=g, dtype=DT)
            grads = cv.quadratic_gradients(A, b, x)
            lhs = float((grads**2).sum(1).mean())
            assert lhs <= G2 + B2 * float((grads.mean(0) ** 2).sum()) + 1e-9 * (1 + lhs)
    # attained at e = M^-1 v: G2 is the smallest constant for this B2
    H, S = A.mean(0), (A @ A).mean(0)
    v = torch.einsum("ijk,ik->j", A, cv.quadratic_gradients(A, b, x_star)) / len(A)
    x = x_star + torch.linalg.solve(B2 * H @ H - S, v)
    grads = cv.quadratic_gradients(A, b, x)
    assert float((grads**2).sum(1).mean() - B2 * (grads.mean(0) ** 2).sum()) == pytest.approx(G2, rel=1e-8)
    with pytest.raises(ValueError, match="B2 must exceed"):
        cv.quadratic_gb(A, b, B2=0.5)


@pytest.mark.parametrize("seed", range(4))
def test_the_drift_lemma_holds_on_random_quadratics(seed):
    A, b = quad.make_quadratics(5, 4, seed=seed, condition=10.0)
    L = float(torch.linalg.eigvalsh(A).max())
    g = torch.Generator().manual_seed(100 + seed)
    for K in (1, 3, 10, 40):
        lr = 1 / (2 * L * (K + 1))
        x = 3 * torch.randn(4, generator=g, dtype=DT)
        gamma = float((cv.quadratic_gradients(A, b, x) ** 2).sum(1).mean())
        bound = cv.drift_bound(lr, K, L, gamma)
        for k in range(1, K + 1):  # every intermediate iterate, not only the last
            drift = float((quad.local_gd(A, b, x, k, lr) ** 2).sum(1).mean())
            assert drift <= bound
    with pytest.raises(ValueError, match="1 / \\(2 L \\(K \\+ 1\\)\\)"):
        cv.drift_bound(0.1, 10, 1.0, 1.0)


def test_the_floor_prediction_is_first_order_in_the_step():
    A, b = quad.make_quadratics(5, 2, seed=0, condition=10.0)
    x_star = quad.global_optimum(A, b)
    errors = []
    for lr in (1e-3, 1e-4):
        exact = quad.fedavg_fixed_point(A, b, 10, lr) - x_star
        pred = cv.fedavg_floor_prediction(A, b, 10, lr)
        errors.append(float((exact - pred).norm() / exact.norm()))
    assert errors[0] < 0.05 and errors[1] < errors[0] / 5  # the relative error shrinks with lr
    assert float(cv.fedavg_floor_prediction(A, b, 1, 0.01).norm()) == 0.0  # one step: no drift


def test_rounds_terms_follow_the_theorems():
    kw = dict(mu=1.0, smoothness=10.0, sigma2=0.0, local_steps=10, sampled=10, num_clients=10, eps=1e-4)
    fedavg = cv.fedavg_rounds_terms(G2=4.0, B2=1.0, **kw)
    assert fedavg["sampling"] == 0.0 and fedavg["noise"] == 0.0  # full participation, exact gradients
    assert fedavg["drift"] == pytest.approx(np.sqrt(10 * 4.0) / np.sqrt(1e-4))
    scaffold = cv.scaffold_rounds_terms(**kw)
    assert set(scaffold) == {"noise", "conditioning", "sampling"} and scaffold["conditioning"] == 10.0
    with pytest.raises(ValueError):
        cv.fedavg_rounds_terms(G2=4.0, B2=1.0, **{**kw, "sampled": 11})


def _federation(seed=0, n=8, d=3):
    g = torch.Generator().manual_seed(seed)
    deltas = torch.randn(n, d, generator=g, dtype=DT) + torch.arange(n, dtype=DT)[:, None] / n
    w = torch.rand(n, generator=g, dtype=DT) * 5 + 0.2
    return deltas, w / w.sum()


@pytest.mark.parametrize("m", [1, 3, 8])
def test_derived_mse_of_the_unbiased_estimator_is_exact(m):
    deltas, p = _federation()
    mean, mse = cv.estimator_moments(deltas, p, m, "unbiased")
    torch.testing.assert_close(mean, p @ deltas)  # unbiased: exactly, over every sample
    torch.testing.assert_close(mse, cv.estimator_mse(deltas, p, m, "unbiased"))


def test_renormalised_estimator_is_biased_with_unequal_weights_and_exact_with_equal_ones():
    deltas, p = _federation()
    mean, mse = cv.estimator_moments(deltas, p, 3, "renormalised")
    assert float((mean - p @ deltas).norm()) > 1e-3
    approx = cv.estimator_mse(deltas, p, 3, "renormalised")
    assert abs(float(approx / mse) - 1) < 0.5  # delta method: first order only
    eq = torch.full((8,), 1 / 8, dtype=DT)
    mean, mse = cv.estimator_moments(deltas, eq, 3, "renormalised")
    torch.testing.assert_close(mean, eq @ deltas)
    torch.testing.assert_close(mse, cv.estimator_mse(deltas, eq, 3, "renormalised"))


def test_unbiasedness_by_a_statistical_test():
    """20,000 samples of m = 4 of N = 30: every coordinate's z-score of the mean error is below 4."""
    g = torch.Generator().manual_seed(7)
    N, m, draws = 30, 4, 20_000
    deltas = torch.randn(N, 5, generator=g, dtype=DT) * 2 + 1
    w = torch.rand(N, generator=g, dtype=DT) + 0.1
    p = w / w.sum()
    idx = torch.stack([torch.randperm(N, generator=g)[:m] for _ in range(draws)])
    est = torch.stack([cv.unbiased_estimate(deltas[i], p[i], N) for i in idx[:50]])
    torch.testing.assert_close(est, N / m * torch.einsum("sm,smd->sd", p[idx[:50]], deltas[idx[:50]]))
    est = N / m * torch.einsum("sm,smd->sd", p[idx], deltas[idx])  # the same, for all draws at once
    err = est - p @ deltas
    z = err.mean(0) / (err.std(0) / draws**0.5)
    assert bool((z.abs() < 4).all()), z
    measured = float((err**2).sum(1).mean())
    assert measured == pytest.approx(float(cv.estimator_mse(deltas, p, m)), rel=0.05)
    # the renormalised estimate depends on the weights' ratios only
    torch.testing.assert_close(
        cv.renormalised_estimate(deltas[:2], 10 * p[:2]), cv.renormalised_estimate(deltas[:2], p[:2])
    )


def test_estimators_keep_the_caller_s_tensors_and_refuse_bad_input():
    deltas, p = _federation()
    before = deltas.clone(), p.clone()
    cv.unbiased_estimate(deltas[:3], p[:3], 8)
    cv.renormalised_estimate(deltas[:3], p[:3])
    cv.estimator_mse(deltas, p, 3, "renormalised")
    assert torch.equal(deltas, before[0]) and torch.equal(p, before[1])
    with pytest.raises(ValueError, match="num_clients"):
        cv.unbiased_estimate(deltas[:3], p[:3], 2)
    with pytest.raises(ValueError, match="estimator"):
        cv.estimator_mse(deltas, p, 3, "mean")
    with pytest.raises(ValueError, match="sum to 0"):
        cv.renormalised_estimate(deltas[:2], torch.zeros(2, dtype=DT))

"""AFL: the exact projection onto the simplex (against SciPy's QP and a bisection in NumPy), the ascent
step on lambda and the lambda-weighted direction."""

import numpy as np
import pytest
import scipy.optimize
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu.aggregators import afl_direction, afl_lambda_step, fedavg, project_simplex


def _bisection_projection(v, iters=200):
    """Reference: w = max(v - theta, 0) with sum(w) = 1, theta found by bisection (no sorting)."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(iters):
        mid = (lo + hi) / 2
        if np.maximum(v - mid, 0).sum() > 1:
            lo = mid
        else:
            hi = mid
    return np.maximum(v - (lo + hi) / 2, 0)


def _qp_projection(v):
    """Reference: min ||w - v||^2 s.t. w >= 0, sum(w) = 1 with SciPy's SLSQP."""
    n = v.shape[0]
    res = scipy.optimize.minimize(
        lambda w: np.sum((w - v) ** 2),
        np.full(n, 1.0 / n),
        jac=lambda w: 2 * (w - v),
        bounds=[(0, None)] * n,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1, "jac": lambda w: np.ones(n)}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return res.x


vectors = arrays(np.float64, st.integers(1, 12), elements=st.floats(-5, 5, allow_nan=False, allow_infinity=False))


@settings(max_examples=80, deadline=None)
@given(v=vectors)
def test_projection_matches_bisection_and_is_on_the_simplex(v):
    w = project_simplex(torch.tensor(v)).numpy()
    assert (w >= 0).all() and w.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(w, _bisection_projection(v), atol=1e-10)


@pytest.mark.parametrize("seed", range(10))
def test_projection_matches_scipy_qp(seed):
    rng = np.random.default_rng(seed)
    v = rng.normal(scale=rng.uniform(0.1, 3), size=rng.integers(2, 15))
    w = project_simplex(torch.tensor(v)).numpy()
    np.testing.assert_allclose(w, _qp_projection(v), atol=1e-6)
    # optimality (variational inequality): (v - w) . (z - w) <= 0 for every vertex z of the simplex
    assert ((v - w)[None, :] @ (np.eye(v.shape[0]) - w[None, :]).T <= 1e-12).all()


def test_projection_fixes_simplex_points_and_works_batched():
    p = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(project_simplex(p), p)
    V = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = torch.stack([project_simplex(v) for v in V])
    torch.testing.assert_close(project_simplex(V), rows)
    torch.testing.assert_close(project_simplex(V + 3.0), rows)  # shift invariance


def test_lambda_step_full_and_partial_participation():
    lam = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    L = torch.tensor([1.0, 2.0, 0.5, 4.0])
    got = afl_lambda_step(lam, L, lr=0.05)
    np.testing.assert_allclose(got.numpy(), _bisection_projection(lam.numpy() + 0.05 * L.double().numpy()), atol=1e-12)
    # two of four clients: unbiased estimate (N/m) L_k on the selected entries
    got = afl_lambda_step(lam, torch.tensor([3.0, 1.0]), lr=0.1, clients=torch.tensor([3, 1]))
    ref = _bisection_projection(lam.numpy() + 0.1 * np.array([0.0, 2.0, 0.0, 6.0]))
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)
    # the weight moves to the worst client
    lam = torch.full((3,), 1 / 3, dtype=torch.float64)
    for _ in range(200):
        lam = afl_lambda_step(lam, torch.tensor([1.0, 1.5, 3.0]), lr=0.1)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))


def test_direction_is_lambda_weighted():
    d = {"w": torch.randn(3, 2, 2, dtype=torch.float64), "b": torch.randn(3, 2, dtype=torch.float64)}
    lam = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    got, ref = afl_direction(d, lam), fedavg(d, lam)
    for k in d:
        torch.testing.assert_close(got[k], ref[k])
    sub = afl_direction(torch.eye(2, dtype=torch.float64), lam, clients=torch.tensor([2, 0]))
    torch.testing.assert_close(sub, torch.tensor([0.3, 0.1], dtype=torch.float64) * 1.5)


def test_bad_input_is_rejected():
    lam = torch.tensor([0.5, 0.5])
    with pytest.raises(ValueError, match="simplex"):
        afl_lambda_step(torch.tensor([0.7, 0.7]), torch.ones(2), lr=0.1)
    with pytest.raises(ValueError, match="losses"):
        afl_lambda_step(lam, torch.tensor([1.0, float("nan")]), lr=0.1)
    with pytest.raises(ValueError, match="one entry per client"):
        afl_lambda_step(lam, torch.ones(3), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        afl_lambda_step(lam, torch.ones(2), lr=0.0)
    with pytest.raises(ValueError, match="repeat"):
        afl_lambda_step(lam, torch.ones(2), lr=0.1, clients=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="index"):
        afl_direction(torch.zeros(1, 2), lam, clients=torch.tensor([2]))
    with pytest.raises(ValueError, match="NaN"):
        project_simplex(torch.tensor([1.0, float("inf")]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        project_simplex([0.1, 0.9])


def test_huge_values_project_onto_the_simplex():
    """[1e300, -1e300] used to give 'index -1 is out of bounds' (u_1 - (u_1 - 1) rounds to 0)."""
    w = project_simplex(torch.tensor([1e300, -1e300], dtype=torch.float64))
    assert w.tolist() == [1.0, 0.0]
    rows = project_simplex(torch.tensor([[1.7e308, -1.7e308, 0.0], [0.2, 0.1, 0.0]], dtype=torch.float64))
    assert rows[0].tolist() == [1.0, 0.0, 0.0]
    # the ordinary row: all three in the support, theta = (0.3 - 1) / 3, w = v - theta
    torch.testing.assert_close(rows[1], torch.tensor([13 / 30, 10 / 30, 7 / 30], dtype=torch.float64))
    assert (rows >= 0).all() and torch.allclose(rows.sum(1), torch.ones(2, dtype=torch.float64))

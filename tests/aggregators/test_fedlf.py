"""FedLF: the exact minimum-norm point of a convex hull (against SciPy's QP) and the layer-wise direction
(against an independent NumPy transcription of the authors' procedure)."""

import numpy as np
import pytest
import scipy.optimize
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import fedlf_direction, min_norm_point


def _scipy_min_norm(P):
    """Reference: min ||lambda^T P||^2 over the simplex with SciPy's SLSQP."""
    m = P.shape[0]
    K = P @ P.T
    res = scipy.optimize.minimize(
        lambda w: w @ K @ w,
        np.full(m, 1.0 / m),
        jac=lambda w: 2 * K @ w,
        bounds=[(0, None)] * m,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1, "jac": lambda w: np.ones(m)}],
        method="SLSQP",
        options={"ftol": 1e-16, "maxiter": 1000},
    )
    return res.x


@pytest.mark.parametrize("seed", range(25))
def test_min_norm_point_matches_scipy_and_satisfies_kkt(seed):
    rng = np.random.default_rng(seed)
    m, d = int(rng.integers(1, 12)), int(rng.integers(1, 15))
    P = rng.normal(size=(m, d)) + rng.normal(scale=rng.uniform(0, 2), size=d)  # a shared component: x often != 0
    lam = min_norm_point(torch.tensor(P)).numpy()
    x = lam @ P
    assert (lam >= 0).all() and lam.sum() == pytest.approx(1.0, abs=1e-12)
    ref = _scipy_min_norm(P) @ P
    assert x @ x <= ref @ ref + 1e-10  # at least as good as SciPy
    np.testing.assert_allclose(x, ref, atol=1e-5)  # the minimum-norm point is unique
    # optimality: p_i . x >= ||x||^2 for every point, with equality on the support
    scale = (P * P).sum(1).max()
    assert (P @ x >= x @ x - 1e-9 * scale).all()
    np.testing.assert_allclose((P @ x)[lam > 1e-9], x @ x, atol=1e-9 * scale)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 8), d=st.integers(1, 6), seed=st.integers(0, 10_000), dup=st.booleans())
def test_min_norm_point_degenerate_inputs(m, d, seed, dup):
    """Duplicated and collinear points, more points than dimensions: still optimal."""
    rng = np.random.default_rng(seed)
    P = rng.normal(size=(m, d))
    if dup:
        P = np.vstack([P, P[:1], 2 * P[:1]])
    lam = min_norm_point(torch.tensor(P)).numpy()
    x = lam @ P
    scale = max((P * P).sum(1).max(), 1e-300)
    assert (P @ x >= x @ x - 1e-9 * scale).all()
    ref = _scipy_min_norm(P) @ P
    assert x @ x <= ref @ ref + 1e-9 * scale


@pytest.mark.parametrize("length", [1e4, 1.5e4, 1e6])
def test_min_norm_point_of_long_points_is_scale_invariant(length):
    """Long points (a diverging run: FedLF at server_lr=4 on dirichlet:0.1 digits, seed 0, had
    updates of length ~1.5e4) once made the affine solve's pinv cut the constraint, return
    ``mu ~ 0`` and empty the active set: IndexError on ``K[idx]``. The minimum-norm point's
    weights do not depend on the points' length."""
    np.testing.assert_allclose(min_norm_point(torch.tensor([[length, 0.0], [0.0, length]])).numpy(), [0.5, 0.5])
    rng = np.random.default_rng(3)
    for _ in range(10):
        P = rng.normal(size=(11, 30)) + rng.normal(size=30)
        P /= np.linalg.norm(P, axis=1, keepdims=True)  # unit rows, as FedLF's rescaled layer updates
        lam = min_norm_point(torch.tensor(P)).numpy()
        lam_long = min_norm_point(torch.tensor(length * P)).numpy()
        x, ref = lam_long @ P, _scipy_min_norm(P) @ P
        assert (lam_long >= 0).all() and lam_long.sum() == pytest.approx(1.0, abs=1e-12)
        assert x @ x <= ref @ ref + 1e-9
        assert (P @ x >= x @ x - 1e-9).all()  # optimal: p_i . x >= ||x||^2
        np.testing.assert_allclose(lam_long @ P, lam @ P, atol=1e-7)


def test_direction_of_long_updates_scales_with_them():
    """fedlf_direction is positively homogeneous: updates 1e4 x longer give a 1e4 x longer step."""
    rng = np.random.default_rng(4)
    g = {"w": torch.tensor(rng.normal(size=(10, 6, 5))), "b": torch.tensor(rng.normal(size=(10, 5)))}
    losses = torch.tensor(rng.uniform(0.5, 2.0, size=10))
    d = fedlf_direction(g, losses)
    d_long = fedlf_direction({k: 1e4 * v for k, v in g.items()}, losses)
    for k in g:
        np.testing.assert_allclose(d_long[k].numpy(), 1e4 * d[k].numpy(), rtol=1e-6, atol=1e-6)


def test_min_norm_point_simple_cases():
    torch.testing.assert_close(min_norm_point(torch.tensor([[3.0, 4.0]])), torch.tensor([1.0], dtype=torch.float64))
    lam = min_norm_point(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 5.0]]))  # origin in the hull
    assert float(torch.linalg.vector_norm(lam @ torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 5.0]]).double())) < 1e-12
    lam = min_norm_point(torch.zeros(3, 2))
    assert float(lam.sum()) == 1.0


def _fedlf_numpy(layers, losses):
    """The authors' procedure, transcribed in NumPy from ``gfedplat/algorithm/FedLF/FedLF.py``
    (github.com/zibinpan/FedLF): ``get_FedLF_d_layers`` over the index ranges ``layers`` (their
    ``Module.Loc_list``: one per parameter tensor) and ``train_a_round``'s rescaling to the
    mean update's length; the QP (cvxopt there) by SciPy."""
    m = layers[0].shape[0]
    d_layers = []
    L = np.asarray(losses, dtype=float) if losses is not None else None
    for G in layers:
        norms = np.linalg.norm(G, axis=1)
        mu = norms.mean()
        Q = G / norms[:, None] * mu
        if L is not None:
            p = np.ones(m) / np.sqrt(m)
            nL = np.linalg.norm(L)
            h = ((L @ p) * L / nL - p * nL) / nL**2
            f = h @ Q
            Q = np.vstack([Q, f / np.linalg.norm(f) * mu])
        d_layers.append(_scipy_min_norm(Q) @ Q)
    d = np.concatenate(d_layers)
    g = np.concatenate(layers, axis=1)
    return d / np.linalg.norm(d) * np.linalg.norm(g.mean(0))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("with_losses", [False, True])
def test_direction_matches_the_authors_procedure(seed, with_losses):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 7))
    shapes = {"fc1.weight": (3, 4), "fc1.bias": (3,), "fc2.weight": (2, 3)}
    common = {k: rng.normal(size=s) for k, s in shapes.items()}
    grads = {k: torch.tensor(common[k] + rng.normal(scale=1.5, size=(m, *s))) for k, s in shapes.items()}
    losses = rng.uniform(0.2, 3.0, size=m) if with_losses else None
    got = fedlf_direction(grads, None if losses is None else torch.tensor(losses))
    ref = _fedlf_numpy([grads[k].reshape(m, -1).numpy() for k in shapes], losses)
    flat = np.concatenate([got[k].reshape(-1).numpy() for k in shapes])
    np.testing.assert_allclose(flat, ref, atol=2e-5 * np.abs(ref).max())


def test_no_client_conflicts_with_any_layer_and_norm_is_the_mean_update():
    rng = np.random.default_rng(3)
    m = 6
    grads = {"a": torch.tensor(rng.normal(size=(m, 5)) + 0.5), "b": torch.tensor(rng.normal(size=(m, 2, 3)))}
    d = fedlf_direction(grads, torch.tensor(rng.uniform(0.5, 2, size=m)))
    for k in grads:
        dots = grads[k].reshape(m, -1) @ d[k].reshape(-1)
        assert (dots >= -1e-10).all()
    mean = torch.cat([grads[k].mean(0).reshape(-1) for k in grads])
    assert float(torch.cat([d[k].reshape(-1) for k in d]).norm()) == pytest.approx(float(mean.norm()), rel=1e-9)


def test_fairness_row_is_respected_and_matters():
    """The fairness row f = h @ U (h = -grad cos(L, 1)) is a row of the hull, so f . d >= 0: a step along -d
    does not make the loss vector less uniform to first order. Plain MGDA does not guarantee it."""
    rng = np.random.default_rng(0)
    violated = 0
    for _ in range(30):
        m = 5
        g = torch.tensor(rng.normal(size=(m, 6)) + 0.3)
        L = torch.tensor(rng.uniform(0.1, 3.0, size=m))
        U = g / g.norm(dim=1, keepdim=True)
        p = torch.full((m,), m**-0.5, dtype=torch.float64)
        h = ((L @ p) * L / L.norm() - p * L.norm()) / L.norm() ** 2
        f = h @ U
        assert float(f @ fedlf_direction(g, L)) >= -1e-10
        violated += float(f @ fedlf_direction(g)) < -1e-6
    assert violated > 0
    g = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(fedlf_direction(g, torch.ones(4)), fedlf_direction(g))  # equal losses: no row


def test_groups_and_zero_layers():
    grads = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.zeros(4, 2, dtype=torch.float64)}
    d = fedlf_direction(grads)
    assert torch.equal(d["b"], torch.zeros(2, dtype=torch.float64))
    both = fedlf_direction(grads, groups={"all": ["w", "b"]})
    assert set(both) == {"w", "b"} and both["w"].shape == (3,)


def test_bad_input_is_rejected_and_inputs_untouched():
    g = torch.randn(3, 4)
    g0 = g.clone()
    fedlf_direction(g, torch.rand(3))
    assert torch.equal(g, g0)
    with pytest.raises(ValueError, match="losses"):
        fedlf_direction(g, torch.rand(2))
    with pytest.raises(ValueError, match="row 1 of"):
        fedlf_direction(torch.tensor([[1.0, 0.0], [float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="groups"):
        fedlf_direction(g, groups={"all": ["x"]})
    with pytest.raises(ValueError, match="Layer group"):
        fedlf_direction({"w": g}, groups={"all": ["x"]})
    with pytest.raises(ValueError, match="points"):
        min_norm_point(torch.zeros(3))

"""The conflict-aware baselines' rules (:mod:`fedlearn_edu.aggregators.conflict`): ConFIG, FedFV and q-FedAvg
against their formulas and the authors' loops (random inputs, NumPy references); q-FedAvg with a large q,
FedFV's refusals. The random problems and helpers are CRAFT's, from tests/aggregators/test_craft.py."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from fedlearn_edu.aggregators import (
    config_direction,
    craft_direction,
    fedfv_direction,
    fedfv_kept,
    qfedavg_step,
)
from tests.aggregators.test_craft import SETTINGS, full_rank_problem, np_unit_rows, t


def test_qfedavg_with_a_large_q_is_finite_and_right():
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    losses = torch.tensor([2.0, 3.0], dtype=torch.float64)
    out = qfedavg_step(g, losses, lr=0.1, q=1000.0)
    assert bool(torch.isfinite(out).all())
    # the written-out rule, in exact rational arithmetic on the ratios (F_0/F_1)^1000 ~ 1e-176
    from fractions import Fraction

    F = [Fraction(2), Fraction(3)]
    lr, q = Fraction(1, 10), 1000
    sq = [Fraction(1) / lr**2] * 2
    h = [q * f ** (q - 1) * s + f**q / lr for f, s in zip(F, sq)]
    coef = [float(f**q / lr / sum(h)) for f in F]
    torch.testing.assert_close(out, torch.tensor(coef, dtype=torch.float64))


def test_fedfv_kept_refuses_nan_alpha_and_nan_losses():
    with pytest.raises(ValueError, match="alpha"):
        fedfv_kept(torch.tensor([0.1, 0.2, 0.3]), math.nan)
    with pytest.raises(ValueError, match="losses"):
        fedfv_kept(torch.tensor([0.1, math.nan, 0.3]), 0.5)


@SETTINGS
@given(full_rank_problem())
def test_config_equivalence_and_formula(problem):
    G, _, _ = problem
    m = G.shape[0]
    craft = craft_direction(t(G), t(np.ones(m)))  # g_hat = 0, uniform rho
    cfg = config_direction(t(G))
    torch.testing.assert_close(craft / craft.norm(), cfg / cfg.norm())
    # ConFIG's own formula with NumPy: g_u = normalise(U^+ 1), g = (sum_i g_i . g_u) g_u
    gu = np.linalg.pinv(np_unit_rows(G)) @ np.ones(m)
    gu /= np.linalg.norm(gu)
    np.testing.assert_allclose(cfg.numpy(), (G @ gu).sum() * gu, rtol=1e-8, atol=1e-9)
    assert (G @ cfg.numpy() > 0).all()


# ------------------------------------------------------------------ FedFV and q-FedAvg
def np_fedfv(G, losses, alpha):
    """FedFV's internal-conflict step as in the authors' code (loops over clients)."""
    m = len(G)
    order = list(np.argsort(losses, kind="stable"))
    keep = order[math.ceil((m - 1) * (1 - alpha)) :] if alpha > 0 else []
    out = [g.copy() for g in G]
    for i in range(m):
        if i in keep:
            continue
        for j in order:
            if j != i:
                dot = G[j] @ out[i]
                if dot < 0:
                    out[i] = out[i] - dot / (G[j] @ G[j]) * G[j]
    gt = np.mean(out, axis=0)
    assume(np.linalg.norm(gt) > 1e-6 * np.abs(G).max())  # rescaling a ~0 vector is ill-posed
    return gt / np.linalg.norm(gt) * np.linalg.norm(G.mean(0))


@SETTINGS
@given(st.integers(1, 7), st.integers(1, 9), st.sampled_from([0.0, 0.1, 0.3]), st.integers(0, 2**32 - 1))
def test_fedfv_matches_the_reference_loop(m, d, alpha, seed):
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((m, d))
    losses = rng.uniform(0, 3, m)
    got = fedfv_direction(t(G), t(losses), alpha).numpy()
    np.testing.assert_allclose(got, np_fedfv(G, losses, alpha), rtol=1e-8, atol=1e-10)
    # a dict input is the same whole-model computation
    got_dict = fedfv_direction({"x": t(G[:, :1]), "y": t(G[:, 1:])}, t(losses), alpha)
    np.testing.assert_allclose(torch.cat([got_dict["x"], got_dict["y"]]).numpy(), got, rtol=1e-10, atol=1e-12)


def test_fedfv_keeps_ceil_alpha_m_highest_loss_clients():
    for m in range(1, 101):
        kept = fedfv_kept(torch.arange(m, dtype=torch.float64), 0.1)
        assert int(kept.sum()) == max(1, math.ceil(round(0.1 * m, 9)))
        assert bool(kept[m - int(kept.sum()) :].all())  # the highest losses
    assert int(fedfv_kept(torch.ones(5), 0.0).sum()) == 0


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 8), st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.integers(0, 2**32 - 1))
def test_qfedavg_matches_its_formula(m, d, q, seed):
    rng = np.random.default_rng(seed)
    G, F, lr = rng.standard_normal((m, d)), rng.uniform(0.1, 3, m), rng.uniform(0.01, 0.5)
    dW = G / lr
    h = q * F ** (q - 1) * (dW**2).sum(1) + F**q / lr
    want = (F[:, None] ** q * dW).sum(0) / h.sum()
    np.testing.assert_allclose(qfedavg_step(t(G), t(F), lr, q).numpy(), want, rtol=1e-10, atol=1e-12)
    if q == 0:
        np.testing.assert_allclose(want, G.mean(0), rtol=1e-10, atol=1e-12)

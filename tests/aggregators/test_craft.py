"""CRAFT's minimum-norm correction (:mod:`fedlearn_edu.aggregators.craft`): defining properties on random
inputs and independent NumPy references. ConFIG, FedFV and q-FedAvg are tested in
tests/aggregators/test_conflict.py, craft_layer_groups in tests/strategies/test_craft.py."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import (
    config_direction,
    craft_direction,
    fedfv_direction,
    pinv_solve,
    qfedavg_step,
)
from fedlearn_edu.params import layer_groups

SETTINGS = settings(max_examples=40, deadline=None)


# ------------------------------------------------------------------ helpers
def np_unit_rows(G):
    return G / np.linalg.norm(G, axis=1, keepdims=True)


def np_craft(G, rho, ghat, rtol=None):
    """The closed form with NumPy's SVD pseudo-inverse (the authors' formula)."""
    U = np_unit_rows(G)
    rho = rho / rho.sum()
    return ghat + np.linalg.pinv(U, rtol=rtol) @ (rho - U @ ghat)


@st.composite
def full_rank_problem(draw, max_m=6, max_d=12):
    """Random pseudo-gradients with a well-conditioned U (full row rank), rho > 0, unit reference."""
    m = draw(st.integers(2, max_m))
    d = draw(st.integers(m, max_d))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.floats(1e-3, 1e3))
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((m, d)) * scale * rng.uniform(0.1, 10, (m, 1))
    assume(np.linalg.cond(np_unit_rows(G)) < 1e4)
    rho = rng.uniform(0.05, 1.0, m)
    ghat = rng.standard_normal(d)
    return G, rho / rho.sum(), ghat / np.linalg.norm(ghat)


@st.composite
def rank_deficient_problem(draw):
    """U with duplicate, parallel (same or opposite direction) or linearly dependent rows."""
    m = draw(st.integers(2, 7))
    d = draw(st.integers(2, 14))
    kind = draw(st.sampled_from(["duplicate", "parallel", "low_rank"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "low_rank":
        r = draw(st.integers(1, min(m, d) - 1 if min(m, d) > 1 else 1))
        G = rng.standard_normal((m, r)) @ rng.standard_normal((r, d))
    else:
        G = rng.standard_normal((m, d))
        i, j = rng.choice(m, 2, replace=False)
        G[j] = G[i] if kind == "duplicate" else G[i] * rng.uniform(0.1, 10) * rng.choice([-1.0, 1.0])
    rho = rng.uniform(0.05, 1.0, m)
    ghat = rng.standard_normal(d)
    # keep clear of the cut-off: non-zero singular values of U well above it
    s = np.linalg.svd(np_unit_rows(G), compute_uv=False)
    assume(((s > 1e-3 * s[0]) | (s < 1e-12 * s[0])).all())
    return G, rho / rho.sum(), ghat / np.linalg.norm(ghat)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


# ------------------------------------------------------------------ CRAFT: defining properties
@SETTINGS
@given(full_rank_problem())
def test_constraint_holds_for_full_rank_U(problem):
    G, rho, ghat = problem
    g = craft_direction(t(G), t(rho), t(ghat)).numpy()
    np.testing.assert_allclose(np_unit_rows(G) @ g, rho, atol=1e-9)
    assert (G @ g > 0).all()  # no selected client conflicts with g


@SETTINGS
@given(full_rank_problem(), st.integers(0, 2**32 - 1))
def test_any_other_feasible_point_is_at_least_as_far(problem, seed):
    G, rho, ghat = problem
    U = np_unit_rows(G)
    g = craft_direction(t(G), t(rho), t(ghat)).numpy()
    z = np.random.default_rng(seed).standard_normal(G.shape[1])
    other = g + z - np.linalg.pinv(U) @ (U @ z)  # g plus a null-space direction: still feasible
    np.testing.assert_allclose(U @ other, rho, atol=1e-8)
    # Pythagoras: ||other - ghat||^2 = ||g - ghat||^2 + ||other - g||^2 >= ||g - ghat||^2
    lhs = np.sum((other - ghat) ** 2)
    np.testing.assert_allclose(lhs, np.sum((g - ghat) ** 2) + np.sum((other - g) ** 2), rtol=1e-8, atol=1e-10)
    assert lhs >= np.sum((g - ghat) ** 2) - 1e-10


@SETTINGS
@given(full_rank_problem())
def test_no_correction_when_the_reference_is_already_feasible(problem):
    G, _, ghat = problem
    U = np_unit_rows(G)
    G = G * np.sign(U @ ghat)[:, None]  # flip clients so that every u_i . ghat > 0
    U = np_unit_rows(G)
    assume((np.abs(U @ ghat) > 1e-3).all())
    s = (U @ ghat).sum()
    ghat = ghat / s  # now rho := U ghat is a feasible, normalised target
    rho = U @ ghat
    g = craft_direction(t(G), t(rho), t(ghat), normalize_reference=False)
    torch.testing.assert_close(g, t(ghat), rtol=1e-9, atol=1e-12)


@SETTINGS
@given(full_rank_problem())
def test_equals_numpy_pinv_full_rank(problem):
    G, rho, ghat = problem
    g = craft_direction(t(G), t(rho), t(ghat)).numpy()
    np.testing.assert_allclose(g, np_craft(G, rho, ghat), rtol=1e-8, atol=1e-9)
    g0 = craft_direction(t(G), t(rho)).numpy()  # no reference: g = U^+ rho
    np.testing.assert_allclose(g0, np_craft(G, rho, np.zeros_like(ghat)), rtol=1e-8, atol=1e-9)


@SETTINGS
@given(rank_deficient_problem())
def test_equals_numpy_pinv_rank_deficient(problem):
    G, rho, ghat = problem
    ref = np_craft(G, rho, ghat, rtol=None)  # NumPy's SVD pinv, cut-off eps * max(m, d)
    g = craft_direction(t(G), t(rho), t(ghat)).numpy()
    np.testing.assert_allclose(g, ref, rtol=1e-7, atol=1e-8)
    x = pinv_solve(t(np_unit_rows(G)), t(rho)).numpy()
    np.testing.assert_allclose(x, np.linalg.pinv(np_unit_rows(G), rtol=None) @ rho, rtol=1e-7, atol=1e-8)


def test_float32_input_uses_float32_cutoff_and_returns_float32():
    rng = np.random.default_rng(3)
    G = rng.standard_normal((5, 300)).astype(np.float32)
    G[4] = -2.5 * G[1]  # parallel (opposite) rows: rank 4
    rho, ghat = np.full(5, 0.2), rng.standard_normal(300)
    g = craft_direction(
        torch.tensor(G), torch.tensor(rho, dtype=torch.float32), torch.tensor(ghat, dtype=torch.float32)
    )
    assert g.dtype == torch.float32
    U64 = np_unit_rows(G.astype(np.float64))
    ref = np_craft(G.astype(np.float64), rho, ghat / np.linalg.norm(ghat), rtol=np.finfo(np.float32).eps * 300)
    np.testing.assert_allclose(g.numpy(), ref, rtol=1e-5, atol=1e-6)
    # torch's own SVD pinv on float32 U (what the authors' code calls) agrees too
    U32 = torch.tensor(U64, dtype=torch.float32)
    gh = torch.tensor(ghat / np.linalg.norm(ghat), dtype=torch.float32)
    r = torch.tensor(rho, dtype=torch.float32)
    torch.testing.assert_close(g, gh + torch.linalg.pinv(U32) @ (r - U32 @ gh), rtol=1e-4, atol=1e-5)


def test_huge_but_finite_updates_do_not_overflow():
    rng = np.random.default_rng(5)
    G, rho, ghat = rng.standard_normal((3, 5)), np.array([0.2, 0.3, 0.5]), rng.standard_normal(5)
    big = G * np.array([[1e200], [1.0], [1e-200]])  # squares overflow / underflow in float64
    torch.testing.assert_close(craft_direction(t(big), t(rho), t(ghat)), craft_direction(t(G), t(rho), t(ghat)))
    tiny = G * np.array([[1.0], [1.0], [1e-200]])  # non-zero, only its squares underflow
    torch.testing.assert_close(craft_direction(t(tiny), t(rho), t(ghat)), craft_direction(t(G), t(rho), t(ghat)))


def test_never_calls_an_svd_or_explicit_pseudo_inverse(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("craft_direction must work through the m x m Gram matrix")

    for name in ("pinv", "svd", "lstsq", "qr"):
        monkeypatch.setattr(torch.linalg, name, forbidden)
    monkeypatch.setattr(torch, "pinverse", forbidden)
    G = torch.randn(4, 50_000, generator=torch.Generator().manual_seed(0))
    g = craft_direction(G, torch.full((4,), 0.25), torch.randn(50_000))
    torch.testing.assert_close((G / G.norm(dim=1, keepdim=True)) @ g, torch.full((4,), 0.25), atol=1e-4, rtol=0)


# ------------------------------------------------------------------ CRAFT: per-group rules
@SETTINGS
@given(full_rank_problem(max_m=5, max_d=8), st.integers(0, 2**32 - 1))
def test_layerwise_equals_per_group_calls(problem, seed):
    G, rho, ghat = problem
    m, d = G.shape
    rng = np.random.default_rng(seed)
    G2, ref2 = rng.standard_normal((m, 3, 2)), rng.standard_normal((3, 2))
    grads = {"a.weight": t(G), "b.weight": t(G2), "b.bias": t(G2[:, 0, :] * 0.5)}
    refs = {"a.weight": t(ghat * 3.0), "b.weight": t(ref2), "b.bias": t(np.ones(2))}
    # per key (each tensor its own group)
    per_key = craft_direction(grads, t(rho), refs)
    for k in grads:
        single = craft_direction(grads[k].reshape(m, -1), t(rho), refs[k].reshape(-1))
        torch.testing.assert_close(per_key[k], single.reshape(grads[k].shape[1:]))
    # with layer groups: "b" concatenates weight and bias into one problem
    groups = layer_groups(list(grads))
    assert groups == {"a": ["a.weight"], "b": ["b.weight", "b.bias"]}
    by_group = craft_direction(grads, t(rho), refs, groups=groups)
    Gb = torch.cat([grads["b.weight"].reshape(m, -1), grads["b.bias"]], dim=1)
    gb = craft_direction(Gb, t(rho), torch.cat([refs["b.weight"].reshape(-1), refs["b.bias"]]))
    torch.testing.assert_close(torch.cat([by_group["b.weight"].reshape(-1), by_group["b.bias"]]), gb)
    torch.testing.assert_close(by_group["a.weight"], per_key["a.weight"])


def test_zero_clients_dropped_rho_renormalised_and_single_client_raw():
    rng = np.random.default_rng(1)
    G = rng.standard_normal((4, 6))
    rho = np.array([0.1, 0.2, 0.3, 0.4])
    ghat = rng.standard_normal(6)
    Gz = G.copy()
    Gz[2] = 0.0  # client 2 sent nothing for this group
    got = craft_direction(t(Gz), t(rho), t(ghat))
    want = craft_direction(t(G[[0, 1, 3]]), t(rho[[0, 1, 3]]), t(ghat))
    torch.testing.assert_close(got, want)
    np.testing.assert_allclose(np_unit_rows(G[[0, 1, 3]]) @ got.numpy(), rho[[0, 1, 3]] / 0.7, atol=1e-10)
    only = np.zeros_like(G)
    only[1] = G[1]
    torch.testing.assert_close(craft_direction(t(only), t(rho), t(ghat)), t(G[1]))  # raw, not normalised
    torch.testing.assert_close(craft_direction(t(np.zeros_like(G)), t(rho)), t(np.zeros(6)))
    # the reference is normalised (any positive scale gives the same g), a zero reference means none
    torch.testing.assert_close(craft_direction(t(G), t(rho), t(7.0 * ghat)), craft_direction(t(G), t(rho), t(ghat)))
    torch.testing.assert_close(craft_direction(t(G), t(rho), t(np.zeros(6))), craft_direction(t(G), t(rho)))
    # rho is normalised: any positive scale gives the same g
    torch.testing.assert_close(craft_direction(t(G), t(10 * rho), t(ghat)), craft_direction(t(G), t(rho), t(ghat)))


# ------------------------------------------------------------------ bad input
def test_bad_inputs_give_clear_errors():
    G = torch.randn(3, 4, dtype=torch.float64)
    rho = torch.full((3,), 1 / 3, dtype=torch.float64)
    bad = G.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="row 1 of"):
        craft_direction(bad, rho)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="row 1 of"):
        craft_direction({"w": bad.reshape(3, 2, 2)}, rho)
    with pytest.raises(ValueError, match="row 1 of"):
        craft_direction({"a.weight": G, "a.bias": bad}, rho, groups={"a": ["a.weight", "a.bias"]})
    with pytest.raises(ValueError, match="m = 0"):
        craft_direction(torch.zeros(0, 4), torch.zeros(0))
    with pytest.raises(ValueError, match=">= 0"):
        craft_direction(G, torch.tensor([0.5, 0.7, -0.2]))
    with pytest.raises(ValueError, match="rho must be Tensor\\[m\\]"):
        craft_direction(G, torch.ones(2))
    with pytest.raises(ValueError, match="sum to zero"):
        craft_direction(G, torch.zeros(3))
    with pytest.raises(ValueError, match="reference must have shape"):
        craft_direction(G, rho, torch.zeros(5))
    with pytest.raises(ValueError, match="NaN"):
        craft_direction(G, rho, torch.full((4,), float("nan")))
    with pytest.raises(ValueError, match="Tensor\\[m, d\\]"):
        craft_direction(torch.zeros(4), rho)
    with pytest.raises(ValueError, match="leading axis"):
        craft_direction({"a": torch.zeros(3, 2), "b": torch.zeros(2, 2)}, rho)
    with pytest.raises(ValueError, match="same keys"):
        craft_direction({"a": G}, rho, {"b": torch.zeros(4)})
    with pytest.raises(ValueError, match="belong to no layer group"):
        craft_direction({"a": G, "b": G}, rho, groups={"g": ["a"]})
    with pytest.raises(ValueError, match="row 2 of"):
        config_direction(torch.cat([G[:2], torch.full((1, 4), float("nan"))]))
    with pytest.raises(ValueError, match="losses"):
        fedfv_direction(G, torch.ones(2))
    with pytest.raises(ValueError, match=">= 0"):
        qfedavg_step(G, torch.tensor([1.0, -1.0, 1.0]), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        qfedavg_step(G, torch.ones(3), lr=0.0)


# ------------------------------------------------------------------ bad rcond
@pytest.mark.parametrize("rcond", [math.nan, -1.0, math.inf])
def test_bad_rcond_raises_instead_of_a_zero_vector(rcond):
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="rcond"):
        craft_direction(g, torch.ones(3), rcond=rcond)
    with pytest.raises(ValueError, match="rcond"):
        pinv_solve(g, torch.ones(3), rcond=rcond)
    with pytest.raises(ValueError, match="rcond"):
        config_direction(g, rcond=rcond)

"""SCAFFOLD's control variates (option II) and server step: defining properties against NumPy."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import scaffold_control_update, scaffold_server_update
from fedlearn_edu.quadratics import local_gd, make_quadratics


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), d=st.integers(1, 5), lr=st.floats(1e-3, 1.0), seed=st.integers(0, 10_000))
def test_control_update_matches_numpy(m, d, lr, seed):
    ci, c, dy = _rand(m, d, seed=seed), _rand(d, seed=seed + 1), _rand(m, d, seed=seed + 2)
    K = torch.randint(1, 20, (m,), generator=torch.Generator().manual_seed(seed))
    got = scaffold_control_update(ci, c, dy, K, lr)
    # x - y_i = -dy_i
    ref = ci.numpy() - c.numpy()[None, :] + (-dy.numpy()) / (K.numpy()[:, None] * lr)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-12)


def test_new_control_is_the_mean_corrected_gradient_plus_the_old_correction():
    """Option II's reading: (x - y_i)/(K eta) is the mean of the corrected gradients g_i(y^k) - c_i + c
    along the client's path, so c_i+ = mean_k g_i(y^k): the client's own gradient, averaged."""
    A, b = make_quadratics(4, 3, seed=2)
    x = _rand(3, seed=5)
    ci, c = _rand(4, 3, seed=6), _rand(3, seed=7)
    K, lr = torch.tensor([1, 3, 6, 10]), 0.05
    dy = local_gd(A, b, x, K, lr, linear=c - ci)
    got = scaffold_control_update(ci, c, dy, K, lr)
    for i in range(4):  # walk client i's path step by step in NumPy
        y, grads = x.numpy().copy(), []
        for _ in range(int(K[i])):
            g = A[i].numpy() @ (y - b[i].numpy())
            grads.append(g)
            y = y - lr * (g - ci[i].numpy() + c.numpy())
        np.testing.assert_allclose(got[i].numpy(), np.mean(grads, axis=0), rtol=1e-10, atol=1e-12)


def test_server_update_matches_the_paper_and_keeps_c_the_mean_of_all_controls():
    """c <- c + (1/N) sum_S dc_i keeps c = (1/N) sum_{all N} c_i under partial participation."""
    N, d = 7, 4
    controls = torch.zeros(N, d, dtype=torch.float64)
    c = torch.zeros(d, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for r in range(6):
        S = torch.randperm(N, generator=g)[:3]
        dy = _rand(3, d, seed=10 + r)
        new_ci = controls[S] + _rand(3, d, seed=50 + r)
        direction, c_new = scaffold_server_update(dy, new_ci - controls[S], c, num_clients=N)
        np.testing.assert_allclose(direction.numpy(), dy.numpy().mean(0), rtol=1e-12)
        np.testing.assert_allclose(c_new.numpy(), c.numpy() + (new_ci - controls[S]).numpy().sum(0) / N, rtol=1e-12)
        controls[S] = new_ci
        c = c_new
        np.testing.assert_allclose(c.numpy(), controls.numpy().mean(0), rtol=1e-10, atol=1e-12)


def test_weighted_direction_and_dict_inputs():
    dy = {"w": _rand(3, 2, 2, seed=1), "b": _rand(3, 2, seed=2)}
    dc = {"w": _rand(3, 2, 2, seed=3), "b": _rand(3, 2, seed=4)}
    c = {"w": torch.zeros(2, 2, dtype=torch.float64), "b": torch.ones(2, dtype=torch.float64)}
    w = torch.tensor([1.0, 2.0, 5.0])
    direction, c_new = scaffold_server_update(dy, dc, c, num_clients=10, weights=w)
    p = (w / w.sum()).double().numpy()
    for k in dy:
        np.testing.assert_allclose(direction[k].numpy(), np.tensordot(p, dy[k].numpy(), axes=1), rtol=1e-6)
        np.testing.assert_allclose(c_new[k].numpy(), c[k].numpy() + dc[k].numpy().sum(0) / 10, rtol=1e-12)
    ci = {k: v.clone() for k, v in dc.items()}
    new = scaffold_control_update(ci, c, dy, 5, 0.1)
    for k in dy:
        np.testing.assert_allclose(new[k].numpy(), ci[k].numpy() - c[k].numpy() - dy[k].numpy() / 0.5, rtol=1e-12)


def test_inputs_are_not_modified():
    ci, c, dy = _rand(3, 2, seed=1), _rand(2, seed=2), _rand(3, 2, seed=3)
    copies = [t.clone() for t in (ci, c, dy)]
    scaffold_control_update(ci, c, dy, 2, 0.1)
    scaffold_server_update(dy, ci, c, num_clients=5)
    for t, t0 in zip((ci, c, dy), copies):
        assert torch.equal(t, t0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"local_steps": 0}, "local_steps"),
        ({"local_steps": torch.tensor([1, 2])}, "local_steps"),
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"deltas": torch.zeros(3, 3)}, "deltas"),
        ({"server_control": torch.zeros(3)}, "server_control"),
        ({"client_controls": torch.full((3, 2), float("nan"))}, "row 0 of"),
    ],
)
def test_control_update_rejects_bad_input(kwargs, match):
    args = {
        "client_controls": torch.zeros(3, 2),
        "server_control": torch.zeros(2),
        "deltas": torch.zeros(3, 2),
        "local_steps": 3,
        "lr": 0.1,
    }
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        scaffold_control_update(**args)


def test_server_update_rejects_bad_input():
    dy = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="num_clients"):
        scaffold_server_update(dy, dy, torch.zeros(2), num_clients=2)
    with pytest.raises(TypeError, match="num_clients"):
        scaffold_server_update(dy, dy, torch.zeros(2), num_clients=3.0)
    with pytest.raises(ValueError, match="control_deltas"):
        scaffold_server_update(dy, torch.zeros(2, 2), torch.zeros(2), num_clients=3)
    with pytest.raises(TypeError, match="server_control"):
        scaffold_server_update(dy, dy, None, num_clients=3)
    with pytest.raises(ValueError, match="weights"):
        scaffold_server_update(dy, dy, torch.zeros(2), num_clients=3, weights=torch.tensor([1.0, -1.0, 1.0]))


def test_numpy_and_tensor_scalars_are_accepted():
    ci, c, dy = torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3)
    ref = scaffold_control_update(ci, c, dy, 4, 0.25)
    torch.testing.assert_close(scaffold_control_update(ci, c, dy, np.int64(4), np.float32(0.25)), ref)
    torch.testing.assert_close(scaffold_control_update(ci, c, dy, torch.tensor(4), torch.tensor(0.25)), ref)
    torch.testing.assert_close(ref, torch.full((2, 3), -1.0))


@pytest.mark.parametrize("flag", ["no", "False", 0, None])
def test_the_finite_flag_must_be_a_bool(flag):
    """``finite="no"`` was truthy: the caller asked for no check and got one (and vice versa)."""
    c_i, c, d = torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3)
    with pytest.raises(TypeError, match=rf"finite must be True or False, got {flag!r}"):
        scaffold_control_update(c_i, c, d, local_steps=2, lr=0.1, finite=flag)

"""FedDyn's linear terms, server state and local objective: defining properties against NumPy/SciPy."""

import numpy as np
import pytest
import scipy.optimize
import torch

from fedlearn_edu.aggregators import feddyn_client_update, feddyn_server_update
from fedlearn_edu.local_objectives import linear_term, proximal_term
from fedlearn_edu.quadratics import make_quadratics


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_linear_term_becomes_the_gradient_at_the_exact_local_solution():
    """First-order condition of L_k(theta) - <g, theta> + alpha/2 ||theta - theta0||^2: at its minimiser
    grad L_k(theta_k) = g - alpha (theta_k - theta0), which is what feddyn_client_update returns."""
    A, b = make_quadratics(3, 4, seed=1)
    theta0, alpha = _rand(4, seed=2), 0.3
    g = _rand(3, 4, seed=3)
    sols = []
    for k in range(3):
        Ak, bk, gk = A[k].numpy(), b[k].numpy(), g[k].numpy()

        def obj(t, Ak=Ak, bk=bk, gk=gk):
            return 0.5 * (t - bk) @ Ak @ (t - bk) - gk @ t + 0.5 * alpha * np.sum((t - theta0.numpy()) ** 2)

        res = scipy.optimize.minimize(obj, theta0.numpy(), method="BFGS", options={"gtol": 1e-12})
        sols.append(res.x)
    thetas = torch.tensor(np.array(sols))
    new_g = feddyn_client_update(g, thetas - theta0, alpha)
    grads = torch.einsum("kij,kj->ki", A, thetas - b)
    torch.testing.assert_close(new_g, grads, rtol=1e-6, atol=1e-6)


def test_server_state_is_the_mean_of_all_linear_terms_and_the_model_formula():
    """h <- h - (alpha/N) sum_S Delta_k keeps h = (1/N) sum_{all N} g_k; theta^t = mean_S theta_k - h/alpha."""
    N, d, alpha = 6, 3, 0.5
    g_all = torch.zeros(N, d, dtype=torch.float64)
    h = torch.zeros(d, dtype=torch.float64)
    theta = _rand(d, seed=0)
    gen = torch.Generator().manual_seed(1)
    for r in range(5):
        S = torch.randperm(N, generator=gen)[:2]
        thetas = theta + _rand(2, d, seed=20 + r)
        deltas = thetas - theta
        g_all[S] = feddyn_client_update(g_all[S], deltas, alpha)
        direction, h = feddyn_server_update(deltas, h, alpha, num_clients=N)
        np.testing.assert_allclose(h.numpy(), g_all.numpy().mean(0), rtol=1e-10, atol=1e-12)
        new_theta = theta + direction
        np.testing.assert_allclose(new_theta.numpy(), thetas.numpy().mean(0) - h.numpy() / alpha, rtol=1e-10)
        theta = new_theta


def test_weighted_mean_replaces_the_uniform_one_and_dicts_work():
    deltas = {"w": _rand(3, 2, 2, seed=1), "b": _rand(3, 2, seed=2)}
    h = {"w": _rand(2, 2, seed=3), "b": _rand(2, seed=4)}
    w = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    direction, h_new = feddyn_server_update(deltas, h, alpha=0.1, num_clients=4, weights=w)
    for k in deltas:
        h_ref = h[k].numpy() - 0.1 / 4 * deltas[k].numpy().sum(0)
        np.testing.assert_allclose(h_new[k].numpy(), h_ref, rtol=1e-12)
        ref = np.tensordot(w.numpy(), deltas[k].numpy(), axes=1) - h_ref / 0.1
        np.testing.assert_allclose(direction[k].numpy(), ref, rtol=1e-12)


def test_local_objective_gradient_matches_the_paper():
    theta = {"w": _rand(2, 3, seed=1).requires_grad_(), "b": _rand(3, seed=2).requires_grad_()}
    lin = {"w": _rand(2, 3, seed=3), "b": _rand(3, seed=4)}
    anchor = {"w": _rand(2, 3, seed=5), "b": _rand(3, seed=6)}
    (proximal_term(theta, anchor, 0.7) - linear_term(theta, lin)).backward()
    for k in theta:
        torch.testing.assert_close(theta[k].grad, -lin[k] + 0.7 * (theta[k].detach() - anchor[k]))


def test_bad_input_is_rejected():
    d = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="alpha"):
        feddyn_client_update(d, d, alpha=0.0)
    with pytest.raises(ValueError, match="deltas"):
        feddyn_client_update(d, torch.zeros(2, 2), alpha=0.1)
    with pytest.raises(ValueError, match="alpha"):
        feddyn_server_update(d, torch.zeros(2), alpha=-1.0, num_clients=3)
    with pytest.raises(ValueError, match="num_clients"):
        feddyn_server_update(d, torch.zeros(2), alpha=1.0, num_clients=1)
    with pytest.raises(ValueError, match="server_state"):
        feddyn_server_update(d, torch.zeros(5), alpha=1.0, num_clients=3)
    with pytest.raises(ValueError, match="row 1 of"):
        feddyn_server_update(torch.tensor([[0.0, 0.0], [float("inf"), 0.0]]), torch.zeros(2), 1.0, 3)


@pytest.mark.parametrize("flag", ["no", "False", 0, None])
def test_the_finite_flag_must_be_a_bool(flag):
    with pytest.raises(TypeError, match=rf"finite must be True or False, got {flag!r}"):
        feddyn_client_update(torch.zeros(2, 3), torch.ones(2, 3), 0.1, finite=flag)

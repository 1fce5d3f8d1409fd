"""Client drift on heterogeneous quadratics: closed-form fixed points, and the four methods run with the
aggregators' pure functions reaching them."""

import numpy as np
import pytest
import torch

from fedlearn_edu.quadratics import (
    fedavg_fixed_point,
    fednova_fixed_point,
    global_optimum,
    local_gd,
    make_quadratics,
    simulate_quadratics,
)


@pytest.fixture(scope="module")
def problem():
    return make_quadratics(5, 3, seed=0)


def test_global_optimum_zeroes_the_weighted_gradient(problem):
    A, b = problem
    p = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    x = global_optimum(A, b, torch.tensor(p)).numpy()
    grad = sum(p[i] * A[i].numpy() @ (x - b[i].numpy()) for i in range(5))
    np.testing.assert_allclose(grad, 0, atol=1e-12)


def test_local_gd_is_the_closed_form_update(problem):
    A, b = problem
    x = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64)
    K = torch.tensor([1, 2, 5, 7, 3])
    deltas = local_gd(A, b, x, K, 0.05)
    for i in range(5):
        M = np.eye(3) - np.linalg.matrix_power(np.eye(3) - 0.05 * A[i].numpy(), int(K[i]))
        np.testing.assert_allclose(deltas[i].numpy(), M @ (b[i].numpy() - x.numpy()), atol=1e-13)


@pytest.mark.parametrize("K", [2, 5, 20])
def test_fedavg_stops_short_of_the_optimum_with_several_local_steps(problem, K):
    A, b = problem
    x_star, x_fa = global_optimum(A, b), fedavg_fixed_point(A, b, K, 0.05)
    # x_fa is a fixed point: the mean client update vanishes there, at x* it does not
    assert float(local_gd(A, b, x_fa, K, 0.05).mean(0).norm()) < 1e-12
    assert float(local_gd(A, b, x_star, K, 0.05).mean(0).norm()) > 1e-3
    assert float((x_fa - x_star).norm()) > 1e-2
    path = simulate_quadratics("fedavg", A, b, rounds=400, local_steps=K, lr=0.05)
    torch.testing.assert_close(path[-1], x_fa, atol=1e-10, rtol=0)


def test_no_drift_with_one_local_step_or_equal_curvatures(problem):
    A, b = problem
    torch.testing.assert_close(fedavg_fixed_point(A, b, 1, 0.05), global_optimum(A, b))
    same = A[:1].expand_as(A).clone()
    torch.testing.assert_close(fedavg_fixed_point(same, b, 10, 0.05), global_optimum(same, b))


@pytest.mark.parametrize("method", ["scaffold", "feddyn"])
@pytest.mark.parametrize("K", [5, torch.tensor([1, 3, 5, 10, 20])])
def test_scaffold_and_feddyn_reach_the_global_optimum(problem, method, K):
    A, b = problem
    path = simulate_quadratics(method, A, b, rounds=400, local_steps=K, lr=0.05, alpha=1.0)
    torch.testing.assert_close(path[-1], global_optimum(A, b), atol=1e-9, rtol=0)
    assert float((path[0] - global_optimum(A, b)).norm()) > 0.1


def test_fednova_removes_the_inconsistency_of_unequal_local_steps(problem):
    """Unequal K_i: as lr -> 0 FedAvg converges to the K-weighted optimum (the surrogate objective
    sum p_i K_i f_i of Wang et al.), FedNova to the true one."""
    A, b = problem
    K = torch.tensor([1, 2, 5, 10, 20])
    x_star = global_optimum(A, b)
    x_tau = global_optimum(A, b, K.double() / 5)
    lr = 1e-3
    x_fa, x_nova = fedavg_fixed_point(A, b, K, lr), fednova_fixed_point(A, b, K, lr)
    assert float((x_fa - x_tau).norm()) < 0.1 * float((x_fa - x_star).norm())
    assert float((x_nova - x_star).norm()) < 0.1 * float((x_fa - x_star).norm())
    path = simulate_quadratics("fednova", A, b, rounds=300, local_steps=K, lr=0.05)
    torch.testing.assert_close(path[-1], fednova_fixed_point(A, b, K, 0.05), atol=1e-10, rtol=0)
    # equal K: FedNova is FedAvg
    torch.testing.assert_close(fednova_fixed_point(A, b, 5, 0.05), fedavg_fixed_point(A, b, 5, 0.05))


def test_make_quadratics_is_seeded_and_well_formed():
    A, b = make_quadratics(4, 3, seed=7, condition=20.0)
    A2, b2 = make_quadratics(4, 3, seed=7, condition=20.0)
    assert torch.equal(A, A2) and torch.equal(b, b2)
    ev = torch.linalg.eigvalsh(A)
    assert bool((ev >= 1 - 1e-10).all()) and bool((ev <= 20 + 1e-10).all())


def test_bad_input_is_rejected(problem):
    A, b = problem
    with pytest.raises(ValueError, match="method"):
        simulate_quadratics("fedprox", A, b, 5, 2, 0.1)
    with pytest.raises(ValueError, match="local_steps"):
        simulate_quadratics("fedavg", A, b, 5, 0, 0.1)
    with pytest.raises(ValueError, match="local_steps"):
        simulate_quadratics("fedavg", A, b, 5, 2.5, 0.1)
    with pytest.raises(ValueError, match="lr"):
        fedavg_fixed_point(A, b, 2, -0.1)
    with pytest.raises(ValueError, match="Tensor\\[N, d, d\\]"):
        global_optimum(A[0], b)
    with pytest.raises(ValueError, match="weights"):
        global_optimum(A, b, torch.zeros(5))
    with pytest.raises(ValueError, match="x0"):
        simulate_quadratics("fedavg", A, b, 5, 2, 0.1, x0=torch.zeros(2))

"""FedNova: ||a_i||_1 against torch's optimisers, the direction against NumPy, FedAvg as a special case."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import fedavg, fednova_aggregate, fednova_norms


def _cumulative_update(tau, lr, momentum=0.0, mu=0.0):
    """Run torch.optim.SGD for tau steps on <g, w> + mu/2 ||w - w0||^2 from w0 = 0 with a constant g = 1:
    the update is -lr * ||a||_1 * g, so this measures ||a||_1 without the closed form."""
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=lr, momentum=momentum)
    for _ in range(tau):
        opt.zero_grad()
        loss = w.sum() + 0.5 * mu * (w**2).sum()
        loss.backward()
        opt.step()
    return float(-w.detach() / lr)


@pytest.mark.parametrize("tau", [1, 2, 7, 30])
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_momentum_norm_matches_torch_sgd_with_momentum(tau, rho):
    got = float(fednova_norms(torch.tensor([tau]), momentum=rho)[0])
    assert got == pytest.approx(_cumulative_update(tau, 0.01, momentum=rho), rel=1e-12)


@pytest.mark.parametrize("tau", [1, 3, 12])
@pytest.mark.parametrize("mu", [0.1, 1.0, 10.0])
def test_proximal_norm_matches_sgd_on_the_proximal_objective(tau, mu):
    lr = 0.05
    got = float(fednova_norms(torch.tensor([tau]), proximal=lr * mu)[0])
    assert got == pytest.approx(_cumulative_update(tau, lr, mu=mu), rel=1e-12)


def test_plain_sgd_norm_is_the_step_count():
    torch.testing.assert_close(
        fednova_norms(torch.tensor([1, 5, 9])), torch.tensor([1.0, 5.0, 9.0], dtype=torch.float64)
    )
    assert float(fednova_norms(4)[0]) == 4.0


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), d=st.integers(1, 5), seed=st.integers(0, 10_000), rho=st.sampled_from([0.0, 0.9]))
def test_direction_matches_numpy(m, d, seed, rho):
    g = torch.Generator().manual_seed(seed)
    deltas = torch.randn(m, d, generator=g, dtype=torch.float64)
    tau = torch.randint(1, 30, (m,), generator=g)
    w = torch.rand(m, generator=g, dtype=torch.float64) + 0.05
    got = fednova_aggregate(deltas, tau, w, momentum=rho)
    t = tau.numpy().astype(float)
    a = t if rho == 0 else (t - rho * (1 - rho**t) / (1 - rho)) / (1 - rho)
    p = w.numpy() / w.numpy().sum()
    ref = (p @ a) * ((p / a) @ deltas.numpy())
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), d=st.integers(1, 5), tau=st.integers(1, 50), seed=st.integers(0, 10_000))
def test_equal_step_counts_give_fedavg(m, d, tau, seed):
    g = torch.Generator().manual_seed(seed)
    deltas = {"w": torch.randn(m, d, 2, generator=g, dtype=torch.float64), "b": torch.randn(m, d, generator=g)}
    w = torch.rand(m, generator=g, dtype=torch.float64) + 0.05
    got, ref = fednova_aggregate(deltas, tau, w), fedavg(deltas, w)
    for k in deltas:
        torch.testing.assert_close(got[k], ref[k])


def test_more_steps_weigh_less_than_in_fedavg():
    """A client with 10x the steps makes a 10x larger update; FedNova removes that bias."""
    deltas = torch.tensor([[1.0, 0.0], [0.0, 10.0]], dtype=torch.float64)  # client 1: 10 steps of the same size
    got = fednova_aggregate(deltas, torch.tensor([1, 10]), torch.ones(2))
    # tau_eff = 5.5; per-step directions (1, 0) and (0, 1) count equally
    torch.testing.assert_close(got, torch.tensor([2.75, 2.75], dtype=torch.float64))


def test_inputs_not_modified_and_bad_input_rejected():
    d = torch.randn(3, 2)
    d0 = d.clone()
    fednova_aggregate(d, torch.tensor([1, 2, 3]), torch.ones(3))
    assert torch.equal(d, d0)
    with pytest.raises(ValueError, match="local_steps"):
        fednova_aggregate(d, torch.tensor([1, 0, 3]), torch.ones(3))
    with pytest.raises(ValueError, match="local_steps"):
        fednova_aggregate(d, torch.tensor([1, 2]), torch.ones(3))
    with pytest.raises(ValueError, match="weights"):
        fednova_aggregate(d, 2, torch.zeros(3))
    with pytest.raises(ValueError, match="momentum"):
        fednova_norms(3, momentum=1.0)
    with pytest.raises(ValueError, match="proximal"):
        fednova_norms(3, proximal=-0.1)
    with pytest.raises(ValueError, match="not both"):
        fednova_norms(3, momentum=0.5, proximal=0.1)
    with pytest.raises(TypeError, match="momentum"):
        fednova_norms(3, momentum="0.9")

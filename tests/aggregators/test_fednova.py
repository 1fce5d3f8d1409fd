"""FedNova: ||a_i||_1 against torch's optimisers, the direction against NumPy, FedAvg as a special case."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlearn_edu.aggregators import fedavg, fednova_aggregate, fednova_norms, fednova_tau_eff


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


# ------------------------------------------------------- the authors' code, transcribed
def _authors_fednova_round(x, grads_fns, taus, ratios, lr, mu=0.0, momentum=0.0):
    """One round of FedNova as the authors' ``distoptim/FedNova.py`` (github.com/JYWa/FedNova) runs it,
    transcribed to plain torch without ``torch.distributed``: ``FedNova.step`` on each client (its
    ``cum_grad``, ``local_normalizing_vec`` and ``local_steps``), then ``FedNova.average`` with
    ``gmf = 0`` (the all-reduce is a sum over the clients). Returns the new server model."""
    cum, vecs, steps = [], [], []
    for grad_fn, tau in zip(grads_fns, taus):
        p, old_init = x.clone(), x.clone()
        buf, cum_grad = None, None
        local_counter, local_normalizing_vec, local_steps = 0.0, 0.0, 0
        for _ in range(tau):
            d_p = grad_fn(p).clone()
            if momentum != 0:
                buf = d_p.clone() if buf is None else buf * momentum + d_p
                d_p = buf
            if mu != 0:
                d_p = d_p + mu * (p - old_init)
            cum_grad = lr * d_p if cum_grad is None else cum_grad + lr * d_p
            p = p - lr * d_p
            if momentum != 0:
                local_counter = local_counter * momentum + 1
                local_normalizing_vec += local_counter
            etamu = lr * mu
            if etamu != 0:
                local_normalizing_vec *= 1 - etamu
                local_normalizing_vec += 1
            if momentum == 0 and etamu == 0:
                local_normalizing_vec += 1
            local_steps += 1
        cum.append(cum_grad)
        vecs.append(local_normalizing_vec)
        steps.append(local_steps)
    if mu != 0:
        tau_eff = sum(s * r for s, r in zip(steps, ratios))
    else:
        tau_eff = sum(v * r for v, r in zip(vecs, ratios))
    total = sum(cum_grad * (r * tau_eff / v) for cum_grad, r, v in zip(cum, ratios, vecs))
    return x - total, [x - c for c in cum]  # average(): old_init -= sum of the scaled cum_grads


def _quadratic_clients(m, d, seed):
    g = torch.Generator().manual_seed(seed)
    A = [torch.diag(torch.rand(d, generator=g, dtype=torch.float64) + 0.5) for _ in range(m)]
    b = [torch.randn(d, generator=g, dtype=torch.float64) for _ in range(m)]
    return [lambda p, A=A_i, b=b_i: A @ (p - b) for A_i, b_i in zip(A, b)]


@pytest.mark.parametrize(
    "mu, momentum", [(0.0, 0.0), (0.0, 0.9), (0.5, 0.0), (2.0, 0.0)], ids=["sgd", "momentum", "prox", "prox2"]
)
def test_default_matches_a_transcription_of_the_authors_code(mu, momentum):
    """The default (``prox_tau_eff="steps"``) is the authors' server step in every case, proximal term included."""
    lr, taus = 0.05, [3, 7, 12]
    ratios = [0.2, 0.3, 0.5]
    x = torch.randn(4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    want, client_models = _authors_fednova_round(x, _quadratic_clients(3, 4, 1), taus, ratios, lr, mu, momentum)
    deltas = torch.stack([xi - x for xi in client_models])
    step = fednova_aggregate(deltas, torch.tensor(taus), torch.tensor(ratios, dtype=torch.float64), momentum, lr * mu)
    torch.testing.assert_close(x + step, want, rtol=1e-12, atol=1e-14)


def test_norms_variant_is_shorter_than_the_authors_step_with_a_proximal_term():
    """``prox_tau_eff="norms"`` rescales by sum p_i ||a_i||_1: the authors' direction times
    sum p ||a||_1 / sum p tau (< 1 with a proximal term), and the same step without one."""
    lr, mu, taus, ratios = 0.05, 1.0, [3, 7, 12], [0.2, 0.3, 0.5]
    x = torch.zeros(4, dtype=torch.float64)
    want, client_models = _authors_fednova_round(x, _quadratic_clients(3, 4, 2), taus, ratios, lr, mu)
    deltas = torch.stack([xi - x for xi in client_models])
    t, w = torch.tensor(taus), torch.tensor(ratios, dtype=torch.float64)
    norms = fednova_aggregate(deltas, t, w, proximal=lr * mu, prox_tau_eff="norms")
    a = (1 - (1 - lr * mu) ** np.array(taus, dtype=float)) / (lr * mu)
    ratio = float(np.dot(ratios, a) / np.dot(ratios, taus))
    assert ratio < 0.9
    torch.testing.assert_close(norms, ratio * (want - x), rtol=1e-12, atol=1e-14)
    assert float(fednova_tau_eff(t, w, proximal=lr * mu)) == pytest.approx(np.dot(ratios, taus))
    assert float(fednova_tau_eff(t, w, proximal=lr * mu, prox_tau_eff="norms")) == pytest.approx(np.dot(ratios, a))
    for kind in ("steps", "norms"):  # without a proximal term the two agree
        torch.testing.assert_close(
            fednova_aggregate(deltas, t, w, momentum=0.5, prox_tau_eff=kind), fednova_aggregate(deltas, t, w, 0.5)
        )
    with pytest.raises(ValueError, match="prox_tau_eff"):
        fednova_aggregate(deltas, t, w, prox_tau_eff="paper")

"""The drift-correcting strategies (:mod:`fedlearn_edu.strategies.drift`): SCAFFOLD, FedDyn and FedNova on
the round driver, loop == vmap for them and for Gossip/DAC, and the baselines' bad arguments.

AFL and FedLF are tested in tests/strategies/test_fairness.py, Gossip and DAC in
tests/strategies/test_decentralized.py, FedVG over SCAFFOLD/FedDyn in tests/strategies/test_fedvg.py.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlearn_edu import (
    AFL,
    DAC,
    SCAFFOLD,
    ClientData,
    FedAvg,
    FedDyn,
    Federation,
    FedNova,
    FedVG,
    Gossip,
    make_model,
    simulate,
)
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import ClientUpdates
from tests.server_steps import Server

KW = dict(rounds=3, clients_per_round=4, lr=0.1, batch_size=8, progress=False, seed=1)


def _model(fed, seed=0, hidden=(16,)):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=hidden, seed=seed)


def _equal_federation(num_clients=4, n=24, seed=0, classes_per_client=3):
    """Clients with equal training-set sizes and disjoint-ish label sets (label skew)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    g = torch.Generator().manual_seed(seed)
    clients = []
    for i in range(num_clients):
        labels = [(i * classes_per_client + j) % 10 for j in range(classes_per_client)]
        idx = torch.nonzero(torch.isin(y, torch.tensor(labels))).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)][: n + 10]
        clients.append(ClientData(x[idx[:n]], y[idx[:n]], x[idx[n:]], y[idx[n:]]))
    return Federation(clients, num_classes=10, name="equal-digits")


# ------------------------------------------------------------------ loop == vmap
@pytest.mark.parametrize("make", [SCAFFOLD, lambda: FedDyn(0.1), FedNova, lambda: DAC(2), lambda: Gossip(0.6)])
def test_loop_and_vmap_engines_give_the_same_run(fed, make):
    a = simulate(fed, _model(fed), make(), engine="loop", momentum=0.0, **KW)
    b = simulate(fed, _model(fed), make(), engine="vmap", momentum=0.0, **KW)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    for name, tree in a.final_state.items():
        for k in tree:
            torch.testing.assert_close(tree[k], b.final_state[name][k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a.client_accuracy, b.client_accuracy, atol=1e-6)


# ------------------------------------------------------------------- SCAFFOLD
def test_scaffold_server_control_is_the_mean_of_the_client_controls(fed):
    s = SCAFFOLD()
    h = simulate(fed, _model(fed), s, **{**KW, "rounds": 4, "clients_per_round": 3})
    controls = h.final_state["control"]
    assert any(float(v.abs().max()) > 0 for v in controls.values())
    for k, c in h.final_server_state["control"].items():
        torch.testing.assert_close(c.cpu(), controls[k].mean(0), rtol=1e-5, atol=1e-7)
    # clients never selected keep c_i = 0
    seen = set(np.concatenate(h.selected).tolist())
    for i in set(range(len(fed))) - seen:
        assert all(float(v[i].abs().max()) == 0 for v in controls.values())


def test_scaffold_first_round_control_is_the_mean_local_gradient(fed):
    """Round 1 (c = c_i = 0): option II gives c_i+ = (x - y_i) / (K_i lr)."""
    model = _model(fed)
    theta = get_params(model)
    s = SCAFFOLD()
    h = simulate(fed, model, s, **{**KW, "rounds": 1})
    sel = h.selected[0]
    steps = torch.tensor([int(np.ceil(fed[i].num_train / 8)) for i in sel])
    for k in theta:
        ci = h.final_state["control"][k][sel]
        delta = -(ci * (steps * 0.1).reshape(-1, *[1] * (ci.dim() - 1)))  # = y_i - x
        torch.testing.assert_close(h.final_params[k], theta[k] + delta.mean(0), rtol=1e-5, atol=1e-6)


def _global_gradient_norm(model, params, federation, weight_decay):
    """||grad (1/N) sum_i [CE_i(w) + (wd/2)||w||^2]|| on the clients' full training sets."""
    w = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    loss = 0
    for c in federation:
        out = torch.func.functional_call(model, w, (c.train_x,))
        loss = loss + F.cross_entropy(out, c.train_y)
    loss = loss / len(federation) + 0.5 * weight_decay * sum((v**2).sum() for v in w.values())
    grads = torch.autograd.grad(loss, list(w.values()))
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))


def test_scaffold_and_feddyn_reach_a_stationary_point_where_fedavg_drifts():
    """Full participation, 8 full-batch local steps, label-skewed clients of equal size, convex model."""
    fed = _equal_federation()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)  # softmax regression: strongly convex with weight decay
    run = dict(rounds=60, clients_per_round=4, local_epochs=8, batch_size=24, lr=0.3, weight_decay=0.05)
    run.update(eval_every=60, progress=False, engine="loop", seed=0)
    norms = {
        s.name: _global_gradient_norm(model, simulate(fed, model, s, **run).final_params, fed, 0.05)
        for s in (FedAvg(), SCAFFOLD(), FedDyn(alpha=0.1))
    }
    assert norms["scaffold"] < 0.05 * norms["fedavg"], norms
    assert norms["feddyn"] < 0.05 * norms["fedavg"], norms


# -------------------------------------------------------------------- FedNova
def test_fednova_is_fedavg_when_every_client_takes_the_same_steps():
    fed = _equal_federation(num_clients=5)
    model = make_model("mlp", (64,), 10, hidden=(8,), seed=0)
    a = simulate(fed, model, FedNova(), **KW)
    b = simulate(fed, model, FedAvg(), **KW)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k])
    assert all(float(d["tau_eff"]) == 3.0 for d in a.diagnostics)  # 24 samples / batch 8


def test_fednova_direction_matches_numpy_with_unequal_steps():
    g = torch.Generator().manual_seed(0)
    deltas = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(3, 2, generator=g)}
    tau, n = torch.tensor([2, 5, 9]), torch.tensor([10, 30, 60])
    upd = ClientUpdates(1, torch.arange(3), deltas, n, torch.zeros(3), None, {"num_steps": tau}, LocalTraining())
    params = {k: torch.zeros(v.shape[1:]) for k, v in deltas.items()}
    g_dir, _, diag = FedNova().direction({"params": params}, upd)
    p = n.numpy() / n.numpy().sum()
    tau_eff = float((p * tau.numpy()).sum())
    assert diag["tau_eff"] == pytest.approx(tau_eff)
    for k, d in deltas.items():
        want = -tau_eff * np.einsum("i,ij->j", p / tau.numpy(), d.numpy())
        np.testing.assert_allclose(g_dir[k].numpy(), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="num_steps"):
        FedNova().direction({"params": params}, ClientUpdates(1, torch.arange(3), deltas, n, torch.zeros(3), None))


def test_fednova_with_a_proximal_term_rescales_by_the_step_counts_as_the_authors_code():
    """FedNova on FedProx's clients: tau_eff = sum p_i tau_i by default (JYWa/FedNova's
    ``FedNova.average``), sum p_i ||a_i||_1 with ``prox_tau_eff="norms"``."""
    g = torch.Generator().manual_seed(0)
    deltas = {"w": torch.randn(3, 4, generator=g, dtype=torch.float64)}
    tau, n = torch.tensor([2, 5, 9]), torch.tensor([10, 30, 60])
    cfg = LocalTraining(lr=0.1, prox_mu=0.5)
    upd = ClientUpdates(1, torch.arange(3), deltas, n, torch.zeros(3), None, {"num_steps": tau}, cfg)
    params = {"w": torch.zeros(4, dtype=torch.float64)}
    p, t = n.numpy() / n.numpy().sum(), tau.numpy().astype(float)
    a = (1 - 0.95**t) / 0.05
    for strategy, tau_eff in ((FedNova(), p @ t), (FedNova(prox_tau_eff="norms"), p @ a)):
        g_dir, _, diag = strategy.direction({"params": params}, upd)
        assert diag["tau_eff"] == pytest.approx(tau_eff)
        np.testing.assert_allclose(-g_dir["w"].numpy(), tau_eff * (p / a) @ deltas["w"].numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="prox_tau_eff"):
        FedNova(prox_tau_eff="paper")


# ------------------------------------------ fake updates (also FedVG's, in test_fedvg.py)
def _fake_updates(num, dim=5, seed=0, extra=None):
    g = torch.Generator().manual_seed(seed)
    deltas = {"w": 0.1 * torch.randn(num, dim, generator=g)}
    return ClientUpdates(1, torch.arange(num), deltas, torch.full((num,), 10), torch.zeros(num), None, extra or {})


# ------------------------------------------------------------------- bad input
def test_bad_arguments_are_rejected_clearly(fed):
    from fedlearn_edu.data import server_validation_split

    with pytest.raises(ValueError, match="alpha"):
        FedDyn(alpha=0)
    with pytest.raises(ValueError, match="lambda_lr"):
        AFL(lambda_lr=-1)
    with pytest.raises(ValueError, match="edge_prob"):
        Gossip(edge_prob=0)
    with pytest.raises(ValueError, match="num_neighbours"):
        DAC(num_neighbours=0)
    with pytest.raises(ValueError, match="tau"):
        DAC(tau=float("nan"))
    with pytest.raises(ValueError, match="below the number of clients"):
        simulate(fed, _model(fed), DAC(num_neighbours=len(fed)), **KW)
    _, val = server_validation_split(fed, fraction=0.2, seed=0)
    with pytest.raises(ValueError, match="clientwise"):
        FedVG(val, base=SCAFFOLD(), mode="layerwise")
    server = Server(SCAFFOLD(), {"w": torch.zeros(5)}, 4)
    upd = _fake_updates(2, extra={"delta_c": {"w": torch.zeros(2, 5)}})
    with pytest.raises(ValueError, match="Tensor\\[m\\]"):
        server.direction(upd, weights=torch.ones(2, 3))
    with pytest.raises(ValueError, match="delta_c"):
        server.direction(_fake_updates(2))

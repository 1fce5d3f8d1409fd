"""SCAFFOLD, FedDyn, FedNova, AFL, FedLF, Gossip and DAC as strategies on the round driver."""

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
    FedLF,
    FedNova,
    FedVG,
    Gossip,
    LocalOnly,
    make_model,
    make_strategy,
    shifted_federation,
    simulate,
)
from fedlearn_edu.aggregators import feddyn_server_update, scaffold_server_update
from fedlearn_edu.cli import main as cli_main
from fedlearn_edu.engine import LocalResult, LocalTraining
from fedlearn_edu.params import get_params, repeat_params
from fedlearn_edu.strategies import STRATEGIES, ClientUpdates, ClientWork
from tests.aggregators.test_afl import _bisection_projection  # the independent simplex projection
from tests.aggregators.test_fedlf import _fedlf_numpy  # the authors' FedLF, transcribed
from tests.server_steps import Server

KW = dict(rounds=3, clients_per_round=4, lr=0.1, batch_size=8, progress=False, seed=1)
NAMES = ("scaffold", "feddyn", "fednova", "afl", "fedlf", "gossip", "dac")


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


# ----------------------------------------------------------------- registration
def test_every_baseline_is_a_registered_strategy_and_runs_from_the_cli(capsys):
    for name in NAMES:
        assert name in STRATEGIES
        assert make_strategy(name).name == name
    rc = cli_main(["run", "--strategy", "scaffold", "--clients", "6", "--clients-per-round", "3", "--rounds", "1",
                   "--no-progress"])  # fmt: skip
    assert rc in (0, None)
    assert "scaffold" in capsys.readouterr().out


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


# ------------------------------------------------------------ FedVG on top
def _fake_updates(num, dim=5, seed=0, extra=None):
    g = torch.Generator().manual_seed(seed)
    deltas = {"w": 0.1 * torch.randn(num, dim, generator=g)}
    return ClientUpdates(1, torch.arange(num), deltas, torch.full((num,), 10), torch.zeros(num), None, extra or {})


@pytest.mark.parametrize("base_name", ["scaffold", "feddyn"])
def test_fedvg_weights_replace_the_uniform_mean_of_scaffold_and_feddyn(fed, base_name):
    from fedlearn_edu.data import server_validation_split

    f, val = server_validation_split(fed, fraction=0.2, seed=0)
    model = _model(f)
    kwargs = {"alpha": 0.1} if base_name == "feddyn" else {}
    h = simulate(f, model, FedVG(val, base=make_strategy(base_name, **kwargs)), **KW)
    w = h.diagnostics[0]["weights"]
    assert not torch.allclose(w, torch.full_like(w, 1 / w.numel()), atol=1e-3)  # FedVG's weights are not uniform
    assert sorted(h.final_state) == (["control"] if base_name == "scaffold" else ["gradient"])

    # the server step is the base's, with the weights in place of the uniform mean
    theta = {"w": torch.zeros(5)}
    m, n = 3, 6
    weights = torch.tensor([0.5, 0.3, 0.2])
    base = make_strategy(base_name, **kwargs)
    server = Server(base, theta, n)
    dc = {"w": torch.randn(m, 5, generator=torch.Generator().manual_seed(1))}
    upd = _fake_updates(m, extra={"delta_c": dc} if base_name == "scaffold" else {})
    g, _ = server.direction(upd, weights=weights)
    if base_name == "scaffold":
        step, c = scaffold_server_update(upd.deltas, dc, {"w": torch.zeros(5)}, n, weights)
        torch.testing.assert_close(server.state["control"]["w"], c["w"])
    else:
        step, hh = feddyn_server_update(upd.deltas, {"w": torch.zeros(5)}, 0.1, n, weights)
        torch.testing.assert_close(server.state["h"]["w"], hh["w"])
        step = {"w": step["w"]}
    torch.testing.assert_close(-g["w"], step["w"])
    manual = (weights.unsqueeze(1) * upd.deltas["w"]).sum(0)
    if base_name == "scaffold":
        torch.testing.assert_close(-g["w"], manual)
    else:
        torch.testing.assert_close(-g["w"], manual + (0.1 / n) * upd.deltas["w"].sum(0) / 0.1)


def test_fedvg_on_scaffold_resumes_bit_identically(fed, tmp_path):
    from fedlearn_edu.data import server_validation_split

    f, val = server_validation_split(fed, fraction=0.2, seed=0)
    model = _model(f)
    full = simulate(f, model, FedVG(val, base=SCAFFOLD()), **{**KW, "rounds": 4})
    ck = tmp_path / "ck.pt"
    simulate(f, model, FedVG(val, base=SCAFFOLD()), **{**KW, "rounds": 2}, checkpoint=ck)
    resumed = simulate(f, model, FedVG(val, base=SCAFFOLD()), **{**KW, "rounds": 4}, checkpoint=ck, resume=True)
    for k in full.final_params:
        assert torch.equal(full.final_params[k], resumed.final_params[k])
    for k in full.final_state["control"]:
        assert torch.equal(full.final_state["control"][k], resumed.final_state["control"][k])


# ------------------------------------------------------------------------ AFL
def test_afl_lambdas_ascend_on_the_clients_losses(fed):
    model = _model(fed)
    theta = get_params(model)
    s = AFL(lambda_lr=0.5)
    h = simulate(fed, model, s, **{**KW, "rounds": 1, "clients_per_round": len(fed)})
    with torch.no_grad():
        losses = np.array(
            [float(F.cross_entropy(torch.func.functional_call(model, theta, (c.train_x,)), c.train_y)) for c in fed]
        )
    want = _bisection_projection(np.full(len(fed), 1 / len(fed)) + 0.5 * losses)
    lambdas = h.final_server_state["lambdas"]
    np.testing.assert_allclose(lambdas.numpy(), want, atol=1e-6)
    np.testing.assert_allclose(h.diagnostics[0]["lambdas"].numpy(), want, atol=1e-6)
    assert float(lambdas.sum()) == pytest.approx(1.0)


def _gfedplat_result_module(iterates):
    """gfedplat's averaged AFL model (``gfedplat/algorithm/AFL/AFL.py`` in github.com/zibinpan/FedLF),
    transcribed: ``result_module = (current_comm_round * result_module + module) / (current_comm_round + 1)``
    after each round's step, ``current_comm_round`` counting from 0; ``result_module`` starts as theta_0."""
    result = None
    for r, x in enumerate(iterates):
        result = x if result is None else {k: (r * result[k] + x[k]) / (r + 1) for k in x}
    return result


def test_afl_averaged_iterate_is_the_authors_running_mean():
    g = torch.Generator().manual_seed(0)
    n, m = 6, 3
    theta = {"w": torch.randn(4, generator=g, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}
    s = AFL(lambda_lr=0.3, iterate="average")
    server = Server(s, theta, n)
    assert s.eval_models(None, server.state, {}, [None] * n)["average"][0] is theta  # before round 1: theta_0
    params, iterates = theta, []
    for t in range(1, 6):
        ids = torch.randperm(n, generator=g)[:m].sort().values
        deltas = {k: torch.randn(m, *v.shape, generator=g, dtype=torch.float64) for k, v in theta.items()}
        signals = {"global_loss": torch.rand(m, generator=g, dtype=torch.float64) + 0.1}
        params, _ = server.aggregate(ClientUpdates(t, ids, deltas, torch.full((m,), 5), torch.zeros(m), None, signals))
        iterates.append({k: v.clone() for k, v in params.items()})
    want = _gfedplat_result_module(iterates)
    models = s.eval_models(None, server.state, {}, [None] * n)
    assert list(models) == ["average", "last"] and models["last"][0] is params
    for k in theta:
        torch.testing.assert_close(server.state["average"][k], want[k], rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(models["average"][0][k], torch.stack([x[k] for x in iterates]).mean(0))
    assert Server(AFL(), theta, n).state["average"] is None and AFL().evaluates == "global"
    with pytest.raises(ValueError, match="iterate"):
        AFL(iterate="mean")


def test_afl_history_evaluates_the_averaged_iterate_and_resumes_bit_identically(fed, tmp_path):
    from fedlearn_edu import evaluate_clients

    kw = {**KW, "rounds": 3, "eval_every": 1}
    last = [simulate(fed, _model(fed), AFL(0.5), **{**kw, "rounds": r}).final_params for r in (1, 2, 3)]
    h = simulate(fed, _model(fed), AFL(0.5, iterate="average"), **kw)
    ref = simulate(fed, _model(fed), AFL(0.5), **kw)
    assert h.evaluated == "average" and ref.evaluated == "global"
    for k in last[-1]:  # training is unchanged: the clients receive theta_t
        assert torch.equal(h.final_params[k], ref.final_params[k])
    np.testing.assert_array_equal(h.other_accuracy["last"], ref.client_accuracy)
    np.testing.assert_array_equal(h.client_accuracy[0], ref.client_accuracy[0])  # theta_0
    avg = {k: sum(p[k] for p in last) / 3 for k in last[-1]}
    acc, _ = evaluate_clients(_model(fed), avg, fed)
    np.testing.assert_allclose(h.client_accuracy[-1], acc, atol=1e-6)
    ck = tmp_path / "afl.pt"
    simulate(fed, _model(fed), AFL(0.5, iterate="average"), **{**kw, "rounds": 2}, checkpoint=ck)
    resumed = simulate(fed, _model(fed), AFL(0.5, iterate="average"), **kw, checkpoint=ck, resume=True)
    np.testing.assert_array_equal(resumed.client_accuracy, h.client_accuracy)


# ---------------------------------------------------------------------- FedLF
def test_fedlf_never_conflicts_with_a_client(fed):
    h = simulate(fed, _model(fed), FedLF(), diagnostics=("conflicts",), **{**KW, "rounds": 4, "local_epochs": 2})
    assert h.conflicts.tolist() == [0, 0, 0, 0]
    assert all("losses" in d for d in h.diagnostics)


def _fedlf_updates(fed, seed=0):
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(32, 16), seed=seed)
    theta = get_params(model)
    g = torch.Generator().manual_seed(seed)
    m = 5
    deltas = {k: 0.05 * torch.randn(m, *v.shape, generator=g, dtype=torch.float64) for k, v in theta.items()}
    losses = 0.5 + torch.rand(m, generator=g, dtype=torch.float64) * 2
    signals = {"global_loss": losses}
    upd = ClientUpdates(1, torch.arange(m), deltas, torch.full((m,), 10), torch.zeros(m), model, signals)
    return model, theta, upd


def test_fedlf_solves_one_problem_per_parameter_tensor_as_the_authors_code(fed):
    """Default ``groups="tensor"``: the authors' ``Module.Loc_list`` (one index range per
    ``model.parameters()`` tensor), their procedure transcribed in ``_fedlf_numpy``;
    ``groups="module"`` (weight and bias of a Linear together) gives another direction."""
    model, theta, upd = _fedlf_updates(fed)
    m = upd.num_clients
    names = [n for n, _ in model.named_parameters()]
    flat = {n: -upd.deltas[n].reshape(m, -1).numpy() for n in names}
    authors = _fedlf_numpy([flat[n] for n in names], upd.signals["global_loss"].numpy())
    d, _, _ = FedLF().direction({"params": theta}, upd)
    got = np.concatenate([d[n].reshape(-1).numpy() for n in names])
    np.testing.assert_allclose(got, authors, atol=2e-5 * np.abs(authors).max())
    modules = sorted({n.rsplit(".", 1)[0] for n in names}, key=lambda mod: names.index(mod + ".weight"))
    per_module = _fedlf_numpy(
        [np.hstack([flat[n] for n in names if n.rsplit(".", 1)[0] == mod]) for mod in modules],
        upd.signals["global_loss"].numpy(),
    )
    d_mod, _, _ = FedLF(groups="module").direction({"params": theta}, upd)
    order = [n for mod in modules for n in names if n.rsplit(".", 1)[0] == mod]
    got_mod = np.concatenate([d_mod[n].reshape(-1).numpy() for n in order])
    np.testing.assert_allclose(got_mod, per_module, atol=2e-5 * np.abs(per_module).max())
    reordered = np.concatenate([d[n].reshape(-1).numpy() for n in order])
    assert np.linalg.norm(reordered - got_mod) > 0.01 * np.linalg.norm(got_mod)  # the two groupings differ
    with pytest.raises(ValueError, match="groups"):
        FedLF(groups="layer")


# -------------------------------------------------------------- decentralised
class _StillEngine:
    """A test double: 'training' leaves every client's model where it starts (mixing only)."""

    name = "still"

    def train(self, model, global_params, datasets, config, seeds, start=None, linear=None):
        m = len(datasets)
        p = start if start is not None else repeat_params(global_params, m)
        return LocalResult({k: v.clone() for k, v in p.items()}, torch.zeros(m), torch.zeros(m, dtype=torch.long))


def test_gossip_with_full_participation_converges_to_the_average():
    n = 8
    s = Gossip(edge_prob=0.4)
    theta = {"w": torch.zeros(3, dtype=torch.float64)}
    state, _ = s.init_state(theta, None, n, seed=3)
    models = {"w": torch.randn(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)}
    state = {**state, "models": models}
    x0 = models["w"].numpy().copy()
    W = state["mixing"].numpy()
    np.testing.assert_allclose(W.sum(0), 1)
    np.testing.assert_allclose(W.sum(1), 1)
    data = [(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long))] * n
    for t in range(1, 301):
        work = ClientWork(t, torch.arange(n), data, [0] * n, LocalTraining(), None, _StillEngine(), 0, torch.ones(n))
        out = s.client_update(work, state, {})
        upd = ClientUpdates(t, torch.arange(n), out.deltas, torch.ones(n), out.train_loss, None, out.signals)
        state, _ = s.aggregate(state, upd)
        models = state["models"]
        if t == 3:
            np.testing.assert_allclose(models["w"].numpy(), np.linalg.matrix_power(W, 3) @ x0, rtol=1e-12)
    np.testing.assert_allclose(models["w"].numpy(), np.tile(x0.mean(0), (n, 1)), atol=1e-8)


def test_gossip_and_dac_keep_one_model_per_client(fed):
    for s in (Gossip(num_neighbours=2), DAC(2)):
        h = simulate(fed, _model(fed), s, **KW)
        assert h.evaluated == "personal"
        assert all(v.shape[0] == len(fed) for v in h.final_params.values())
        # clients never selected still hold theta_0
        theta = get_params(_model(fed))
        for i in set(range(len(fed))) - set(np.concatenate(h.selected).tolist()):
            assert all(torch.equal(h.final_params[k][i], theta[k]) for k in theta)


def test_dac_scores_are_inverse_losses_and_it_finds_its_cluster():
    fed = shifted_federation("digits", "label", 2, 4, samples_per_client=40, seed=0)
    model = _model(fed)
    theta = get_params(model)
    run = dict(rounds=1, clients_per_round=len(fed), lr=0.1, batch_size=8, progress=False, seed=0, local_epochs=2)
    s = DAC(num_neighbours=2, tau=30.0, warmup=False)
    h = simulate(fed, model, s, **run)
    nb = h.diagnostics[0]["neighbours"]
    with torch.no_grad():  # without the warm-up, round 1 scores theta_0 everywhere: equal scores
        for i in range(len(fed)):
            c = fed[i]
            want = 1 / float(F.cross_entropy(torch.func.functional_call(model, theta, (c.train_x,)), c.train_y))
            for j in nb[i].tolist():
                assert float(h.final_server_state["similarity"][i, j]) == pytest.approx(want, rel=1e-5)
    s2 = DAC(num_neighbours=2, tau=30.0)
    h2 = simulate(fed, model, s2, **{**run, "rounds": 12})
    cluster = torch.arange(len(fed)) // 4
    late = torch.stack([d["neighbours"] for d in h2.diagnostics[-4:]])  # Tensor[4, N, 2]
    same = (cluster[late] == cluster.view(1, -1, 1)).double().mean()
    assert float(same) > 0.9  # random sampling would give 3/7


def test_dac_warms_up_every_client_before_the_first_scoring_as_the_authors_code():
    """train_DAC (github.com/edvinli/DAC, utils.py) trains every client once, then scores: round 1
    trains alone (the models of LocalOnly's first round), round 2 scores the trained models."""
    fed = shifted_federation("digits", "label", 2, 3, samples_per_client=30, seed=0)
    model = _model(fed)
    run = dict(clients_per_round=len(fed), lr=0.1, batch_size=8, progress=False, seed=0, local_epochs=2)
    one = DAC(num_neighbours=2)
    h1 = simulate(fed, model, one, rounds=1, **run)
    assert h1.diagnostics[0]["neighbours"].shape == (len(fed), 0)
    assert torch.count_nonzero(h1.final_server_state["similarity"]) == 0  # no scores yet
    alone = simulate(fed, model, LocalOnly(), rounds=1, **run)
    np.testing.assert_array_equal(h1.client_accuracy, alone.client_accuracy)
    two = DAC(num_neighbours=2)
    h2 = simulate(fed, model, two, rounds=2, **run)
    nb = h2.diagnostics[1]["neighbours"]
    warmed = h1.final_params  # Tensor[N, ...]: the models after the warm-up
    with torch.no_grad():
        for i in range(len(fed)):
            c = fed[i]
            for j in nb[i].tolist():
                out = torch.func.functional_call(model, {k: v[j] for k, v in warmed.items()}, (c.train_x,))
                assert float(h2.final_server_state["similarity"][i, j]) == pytest.approx(
                    1 / float(F.cross_entropy(out, c.train_y)), rel=1e-5
                )
    similarity = h2.final_server_state["similarity"]
    scores = similarity[similarity > 0]
    assert float(scores.max() - scores.min()) > 0.05  # trained models: the scores differ, unlike theta_0's


def test_dac_var_temperature_is_indexed_as_the_authors_code():
    """The authors compute tau_new = tau_function(round, tau, 0.2) (utils.py: 2a / (1 + exp(-b x)) - a + 1)
    at the end of scoring round ``round`` (from 0) and draw with it in the next: the draw of scoring
    round r uses tau_function(r - 1). Driver round t is scoring round t - 2 (warm-up) or t - 1."""

    def tau_function(x, a, b):
        return 2 * a / (1 + np.exp(-b * x)) - a + 1

    var, no_warmup = DAC(tau=30.0, tau_rate=0.2), DAC(tau=30.0, tau_rate=0.2, warmup=False)
    for t in range(3, 40):
        assert var.temperature(t) == pytest.approx(tau_function(t - 3, 30.0, 0.2), rel=1e-14)
        assert no_warmup.temperature(t) == pytest.approx(tau_function(t - 2, 30.0, 0.2), rel=1e-14)
    assert var.scoring_round(1) == -1 and var.scoring_round(2) == 0 and no_warmup.scoring_round(1) == 0
    assert DAC(tau=30.0).temperature(7) == 30.0
    with pytest.raises(TypeError, match="warmup"):
        DAC(warmup=1)


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


def test_compare_methods_runs_gossip_and_dac_on_request():
    from fedlearn_edu import compare_methods

    fed = shifted_federation("digits", "label", 2, 3, samples_per_client=30, seed=0)
    out = compare_methods(fed, ("fedavg", "gossip", "dac"), model_kwargs={"hidden": (16,)}, num_neighbours=2,
                          rounds=2, batch_size=8, lr=0.1, seed=0)  # fmt: skip
    assert list(out) == ["fedavg", "gossip", "dac"]
    assert out["gossip"].evaluated == out["dac"].evaluated == "personal"
    assert out["dac"].diagnostics[0]["neighbours"].shape == (len(fed), 0)  # round 1: the warm-up
    assert out["dac"].diagnostics[1]["neighbours"].shape == (len(fed), 2)
    with pytest.raises(ValueError, match="Unknown method"):
        compare_methods(fed, ("gosip",), rounds=1)

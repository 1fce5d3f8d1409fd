"""The fairness strategies (:mod:`fedlearn_edu.strategies.fairness`): AFL with a huge lambda_lr runs or
refuses it by name; AFL's and FedLF's runs on the round driver."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlearn_edu import (
    AFL,
    FedLF,
    make_model,
    simulate,
)
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import ClientUpdates
from tests.aggregators.test_afl import _bisection_projection
from tests.aggregators.test_fedlf import _fedlf_numpy
from tests.bad_client import SMALL
from tests.server_steps import Server
from tests.strategies.test_drift import KW, _model


def test_afl_with_a_huge_lambda_lr_runs_or_names_it(setting):
    fed, _, _, model = setting
    h = simulate(fed, model, AFL(lambda_lr=1e300), **SMALL)
    lam = h.final_server_state["lambdas"]
    assert torch.isclose(lam.sum(), torch.tensor(1.0, dtype=torch.float64)) and (lam >= 0).all()
    with pytest.raises(ValueError, match="lambda_lr"):
        simulate(fed, model, AFL(lambda_lr=1e308), **SMALL)


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

"""The one round driver: the strategy protocol, the local-objective hook, evaluation, faults."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlearn_edu import (
    IFCA,
    ClientData,
    Ditto,
    FedAdam,
    FedAvg,
    Federation,
    FedVG,
    LocalOnly,
    QFedAvg,
    evaluate_clients,
    make_model,
    simulate,
)
from fedlearn_edu.aggregators import fedavg
from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine
from fedlearn_edu.params import get_params, stack_params
from fedlearn_edu.personalization import simulate_ditto, simulate_ifca, simulate_local
from fedlearn_edu.utils import derive_seed

KW = dict(rounds=3, clients_per_round=4, lr=0.1, batch_size=8, progress=False, seed=1)


def _model(fed, seed=0):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(16,), seed=seed)


# ------------------------------------------------------------ local-objective hook
def test_linear_term_follows_its_formula_in_both_engines():
    """One full-batch step on CE + (mu/2)||w - anchor||^2 + <c_j, w>: w - lr (grad CE + mu (w - a) + c_j)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    theta = get_params(model)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    start = stack_params([{k: v + 0.2 * torch.randn_like(v) for k, v in theta.items()} for _ in range(2)])
    linear = {k: torch.randn(2, *v.shape) for k, v in theta.items()}
    cfg = LocalTraining(epochs=1, batch_size=6, lr=0.3, prox_mu=0.4)
    for engine in (LoopEngine(), VmapEngine()):
        out = engine.train(model, theta, [(x, y)] * 2, cfg, [0, 1], start=start, linear=linear)
        for j in range(2):
            w = {k: v[j].clone().requires_grad_(True) for k, v in start.items()}
            ce = F.cross_entropy(x @ w["weight"].T + w["bias"], y)
            grads = dict(zip(w, torch.autograd.grad(ce, list(w.values()))))
            for k in theta:
                want = start[k][j] - 0.3 * (grads[k] + 0.4 * (start[k][j] - theta[k]) + linear[k][j])
                torch.testing.assert_close(out.params[k][j], want)


def test_loop_and_vmap_agree_with_linear_terms_over_uneven_clients(fed):
    model = _model(fed)
    theta = get_params(model)
    ds = [(c.train_x[: 10 + 7 * i], c.train_y[: 10 + 7 * i]) for i, c in enumerate(fed)][:4]
    g = torch.Generator().manual_seed(0)
    linear = {k: 0.01 * torch.randn(4, *v.shape, generator=g) for k, v in theta.items()}
    cfg = LocalTraining(epochs=2, batch_size=8, lr=0.1, momentum=0.5, prox_mu=0.1)
    a = LoopEngine().train(model, theta, ds, cfg, [3, 4, 5, 6], linear=linear)
    b = VmapEngine(max_chunk=3).train(model, theta, ds, cfg, [3, 4, 5, 6], linear=linear)
    plain = LoopEngine().train(model, theta, ds, cfg, [3, 4, 5, 6])
    for k in theta:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(a.params["out.bias"], plain.params["out.bias"])
    with pytest.raises(ValueError, match="linear must be stacked"):
        LoopEngine().train(model, theta, ds, cfg, [3, 4, 5, 6], linear={k: v[:2] for k, v in linear.items()})


# ------------------------------------------------------------------ the driver
def test_caller_model_is_untouched_and_runs_repeat(fed):
    model = _model(fed)
    model.train(False)
    before = {k: (p.data_ptr(), p.detach().clone(), p.device) for k, p in model.named_parameters()}
    h1 = simulate(fed, model, FedAdam(server_lr=0.05), **KW)
    h2 = simulate(fed, model, FedAdam(server_lr=0.05), **KW)
    for k, p in model.named_parameters():
        ptr, value, device = before[k]
        assert p.data_ptr() == ptr and p.device == device and torch.equal(p, value)
    assert model.training is False
    np.testing.assert_array_equal(h1.client_accuracy, h2.client_accuracy)
    assert all(torch.equal(h1.final_params[k], h2.final_params[k]) for k in h1.final_params)


def test_personalised_methods_are_strategies_run_by_simulate(fed):
    model = _model(fed)
    for conv, strategy in (
        (lambda: simulate_local(fed, model, **KW), LocalOnly()),
        (lambda: simulate_ifca(fed, model, 2, warmup_rounds=1, **KW), IFCA(2, warmup_rounds=1)),
        (lambda: simulate_ditto(fed, model, 0.3, FedAdam(server_lr=0.05), **KW), Ditto(0.3, FedAdam(server_lr=0.05))),
    ):
        a, b = conv(), simulate(fed, model, strategy, **KW)
        np.testing.assert_array_equal(a.client_accuracy, b.client_accuracy)
        assert a.evaluated == b.evaluated == strategy.evaluates != "global"
    assert b.strategy == "ditto+fedadam" and set(b.other_accuracy) == {"global"}
    assert b.final_state["personal"]["out.weight"].shape == (fed.num_clients, 10, 16)
    ifca = simulate(fed, model, IFCA(2, warmup_rounds=1), **KW)
    assert ifca.model_index.shape == (4, fed.num_clients) and set(np.unique(ifca.model_index)) <= {0, 1}
    picked = ifca.final_state["cluster"]
    assert ((picked >= 0) == torch.as_tensor(np.isin(np.arange(6), np.concatenate(ifca.selected)))).all()


@pytest.mark.parametrize("make", [lambda: Ditto(0.3), LocalOnly])
def test_personalised_strategies_agree_across_engines(fed, make):
    model = _model(fed)
    a = simulate(fed, model, make(), engine="loop", **KW)
    b = simulate(fed, model, make(), engine="vmap", **KW)
    assert (a.config["engine"], b.config["engine"]) == ("loop", "vmap")
    np.testing.assert_allclose(a.client_loss, b.client_loss, rtol=1e-4, atol=1e-5)
    for k, v in a.final_state["personal"].items():
        torch.testing.assert_close(b.final_state["personal"][k], v, rtol=1e-4, atol=1e-5)


def test_evaluate_clients_with_stacked_models_matches_a_per_client_loop(fed):
    model = _model(fed)
    models = stack_params([get_params(_model(fed, seed=s)) for s in range(3)])
    which = torch.tensor([2, 0, 1, 1, 0, 2])
    acc, loss = evaluate_clients(model, models, fed, batch_size=7, which=which)
    for i, c in enumerate(fed):
        p = {k: v[int(which[i])] for k, v in models.items()}
        logits = torch.func.functional_call(model, p, (c.test_x,))
        assert acc[i] == pytest.approx(float((logits.argmax(1) == c.test_y).double().mean()))
        assert loss[i] == pytest.approx(float(F.cross_entropy(logits, c.test_y)), rel=1e-5)
    with pytest.raises(ValueError, match="which"):
        evaluate_clients(model, models, fed, which=torch.tensor([0, 1]))


def test_models_own_their_split():
    for name, shape in (("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("smallcnn", (3, 8, 8)), ("resnet20", (3, 8, 8))):
        m = make_model(name, shape, 10)
        x = torch.randn(3, *shape)
        z = m.features(x)
        assert z.dim() == 2
        torch.testing.assert_close(m.head(z), m(x), rtol=0, atol=0)
        torch.testing.assert_close(m.head(z, features=True), m(x, features=True), rtol=0, atol=0)
        head = dict(m.named_modules())[m.head_layer]
        assert head.in_features == z.shape[1]


# ------------------------------------------------------------------------ faults
def _with_nan_client(fed, bad=2):
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, c.info) for c in fed]
    clients[bad].train_x[0, 0, 0, 0] = float("nan")  # after construction: ClientData refuses NaN inputs
    return Federation(clients, fed.num_classes, fed.name)


def test_skip_drops_a_client_with_nan_data_and_aggregates_the_others(fed):
    bad_fed = _with_nan_client(fed, bad=2)
    model = _model(fed)
    kw = dict(KW, rounds=1, clients_per_round=6, engine="loop")
    with pytest.raises(FloatingPointError, match=r"training data of client\(s\) \[2\] hold NaN"):
        simulate(bad_fed, model, FedAvg(), **kw)
    h = simulate(bad_fed, model, FedAvg(), on_nonfinite="skip", **kw)
    assert h.dropped == [{2: "its training data hold NaN/Inf values"}]
    assert torch.isfinite(torch.cat([v.flatten() for v in h.final_params.values()])).all()
    # the global model is exactly FedAvg over the five other clients
    theta = get_params(model)
    others = [i for i in range(6) if i != 2]
    cfg = LocalTraining(1, 8, 0.1)
    local = LoopEngine().train(
        model, theta, [(fed[i].train_x, fed[i].train_y) for i in others], cfg, [derive_seed(1, 1, i) for i in others]
    )
    step = fedavg({k: local.params[k] - theta[k] for k in theta}, fed.num_train_samples[others].double())
    for k in theta:
        torch.testing.assert_close(h.final_params[k], theta[k] + step[k])
    assert h.diagnostics[0]["weights"].shape == (5,)


def test_skip_with_every_client_dropped_skips_the_round(fed):
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y) for c in fed]
    for c in clients:
        c.train_x[:] = float("nan")  # after construction: ClientData refuses NaN inputs
    all_bad = Federation(clients, fed.num_classes)
    model = _model(fed)
    with pytest.warns(UserWarning, match="every selected client was dropped"):
        h = simulate(all_bad, model, FedAvg(), on_nonfinite="skip", **dict(KW, rounds=2))
    assert all(torch.equal(h.final_params[k], v) for k, v in get_params(model).items())
    assert [len(d) for d in h.dropped] == [4, 4] and np.isnan(h.train_loss).all()
    with pytest.raises(ValueError, match="on_nonfinite"):
        simulate(fed, model, FedAvg(), on_nonfinite="ignore")


def test_errors_name_the_real_cause(fed):
    model = _model(fed)
    with pytest.raises(FloatingPointError, match="diverged") as err:
        simulate(fed, model, FedAvg(), **dict(KW, lr=1e30, local_epochs=3))
    assert "client lr" in str(err.value)
    with pytest.raises(FloatingPointError, match="server_lr") as err:
        simulate(fed, model, FedAvg(server_lr=1e308), **dict(KW, lr=1.0))
    assert "every client update was finite" in str(err.value) and "client lr" not in str(err.value)
    # q-FedAvg's weights are computed in logarithms: a huge q no longer overflows
    h = simulate(fed, model, QFedAvg(q=1e4), **KW)
    assert all(bool(torch.isfinite(v).all()) for v in h.final_params.values())
    x, y = torch.rand(10, *fed.input_shape), torch.arange(10) % 10
    x[3, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="validation set holds NaN"):
        FedVG((x, y))

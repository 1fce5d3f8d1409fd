"""FedVG as a strategy: its server step, its signals and its runs in the driver.

The rule itself, as a pure function, is tested in tests/aggregators/test_fedvg.py.
"""

import pytest
import torch

from fedlearn_edu import (
    SCAFFOLD,
    FedAvg,
    FedAvgM,
    FedProx,
    FedVG,
    federated_dataset,
    make_model,
    simulate,
)
from fedlearn_edu.aggregators import (
    feddyn_server_update,
    fedvg_aggregate,
    fedvg_layerwise_weights,
    fedvg_mixed_weights,
    fedvg_weights,
    scaffold_server_update,
)
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params
from fedlearn_edu.signals import validation_gradient_norms
from fedlearn_edu.strategies import ClientUpdates, make_strategy
from tests.fedvg_inputs import perturbed_clients, validation_set
from tests.server_steps import Server
from tests.strategies.test_drift import KW, _fake_updates, _model


def _updates(model, deltas, n, round_=1):
    m = next(iter(deltas.values())).shape[0]
    return ClientUpdates(round_, torch.arange(m), deltas, torch.tensor(n), torch.zeros(m), model)


@pytest.fixture(scope="module")
def round_data():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    params = get_params(model)
    thetas = perturbed_clients(model, 3, seed=4)
    deltas = {k: thetas[k] - params[k] for k in params}
    return model, params, thetas, deltas, validation_set(50), [10, 20, 70]


@pytest.mark.parametrize(
    "mode,mix", [("clientwise", False), ("layerwise", False), ("clientwise", True), ("layerwise", True)]
)
def test_strategy_aggregate_equals_the_formula(round_data, mode, mix):
    model, params, thetas, deltas, val, n = round_data
    strategy = FedVG(val, mode=mode, mix=mix, server_lr=0.5)
    server_strategy = Server(strategy, params)
    new, diag = server_strategy.aggregate(_updates(model, deltas, n))
    norms = validation_gradient_norms(model, thetas, val)  # theta_k computed here, not rebuilt
    s = fedvg_weights(norms) if mode == "clientwise" else fedvg_layerwise_weights(norms)
    if mix:
        s = fedvg_mixed_weights(s, torch.tensor(n))
    step = fedvg_aggregate(deltas, s)
    for k in params:
        torch.testing.assert_close(new[k], params[k] + 0.5 * step[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diag["grad_norms"], norms, rtol=1e-5, atol=1e-6)
    assert diag["weights"].shape == (3,) and float(diag["weights"].sum()) == pytest.approx(1.0, abs=1e-6)
    assert ("layer_weights" in diag) == (mode == "layerwise")


def test_server_momentum_is_fedavgm_on_the_fedvg_weighted_pseudo_gradient(round_data):
    model, params, thetas, deltas, val, n = round_data
    s = FedVG(val, server_momentum=0.9, server_lr=0.7)
    server_s = Server(s, params)
    p1, d1 = server_s.aggregate(_updates(model, deltas, n))
    step1 = fedvg_aggregate(deltas, d1["weights"])  # v1 = -step1
    for k in params:
        torch.testing.assert_close(p1[k], params[k] + 0.7 * step1[k], rtol=1e-5, atol=1e-6)
    p2, d2 = server_s.aggregate(_updates(model, deltas, n, 2))  # v2 = 0.9 v1 - step2
    step2 = fedvg_aggregate(deltas, d2["weights"])
    for k in params:
        torch.testing.assert_close(p2[k], p1[k] + 0.7 * (0.9 * step1[k] + step2[k]), rtol=1e-5, atol=1e-6)
    server_s = Server(s, params)  # a fresh server state resets the momentum
    p1b, _ = server_s.aggregate(_updates(model, deltas, n))
    for k in params:
        torch.testing.assert_close(p1b[k], p1[k])


def test_composition_with_fedprox_and_fedavgm():
    val = validation_set(8)
    prox = FedVG.on_top_of(FedProx(mu=0.3, server_lr=0.5), val)
    assert prox.prox_mu == 0.3 and prox.server_lr == 0.5 and prox.server_momentum == 0
    assert prox.configure_local(LocalTraining()).prox_mu == 0.3
    assert FedVG(val).configure_local(LocalTraining()).prox_mu == 0.0
    avgm = FedVG.on_top_of(FedAvgM(server_lr=0.2, momentum=0.8), val, mode="layerwise")
    assert (avgm.server_momentum, avgm.server_lr, avgm.mode) == (0.8, 0.2, "layerwise")
    assert FedVG.on_top_of(FedAvg(), val).server_momentum == 0
    with pytest.raises(TypeError, match="FedVG.s base must be a fedlearn_edu Strategy"):
        FedVG.on_top_of(object(), val)
    with pytest.raises(ValueError, match="mode"):
        FedVG(val, mode="spectral")
    with pytest.raises(ValueError, match="server_momentum"):
        FedVG(val, server_momentum=1.0)
    assert isinstance(make_strategy("fedvg", val_data=val), FedVG)


def test_simulate_with_fedvg_records_weights_and_downweights_noisy_clients():
    from fedlearn_edu.data import add_label_noise

    fed = federated_dataset("digits", "iid", num_clients=6, seed=0)
    fed, val = server_validation_split(fed, 0.1, seed=0)
    fed = add_label_noise(fed, [0, 1], 0.9, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(32,), seed=0)
    h = simulate(fed, model, FedVG(val), rounds=12, clients_per_round=6, local_epochs=2, progress=False)
    w = torch.stack([d["weights"] for d in h.diagnostics])
    torch.testing.assert_close(w.sum(1), torch.ones(12), rtol=1e-5, atol=1e-5)
    assert h.diagnostics[0]["grad_norms"].shape == (6, 4)
    # once the global model is trained, the two pure-noise clients weigh less than the clean ones
    assert float(w[-4:, :2].mean()) < float(w[-4:, 2:].mean())
    assert h.metrics()["mean"] > 0.7


def test_cli_runs_fedvg(capsys):
    from fedlearn_edu.cli import main

    assert (
        main(
            [
                "run",
                "--strategy",
                "fedvg",
                "--rounds",
                "2",
                "--clients",
                "6",
                "--clients-per-round",
                "3",
                "--alpha",
                "1.0",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "fedvg" in capsys.readouterr().out


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

"""CRAFT as a strategy: its server step, its signals and its runs in the driver.

The rule itself, as a pure function, is tested in tests/aggregators/test_craft.py.
"""

import numpy as np
import pytest
import torch

from fedlearn_edu import CRAFT, ConFIG, FedFV, QFedAvg, federated_dataset, make_model, make_strategy, simulate
from fedlearn_edu.aggregators import (
    config_direction,
    craft_direction,
    fedfv_direction,
    qfedavg_step,
)
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params, layer_groups
from fedlearn_edu.strategies import ClientUpdates, craft_layer_groups
from tests.server_steps import Server


def _updates(deltas, n, model=None, signals=None, train_loss=None, config=None):
    m = next(iter(deltas.values())).shape[0]
    return ClientUpdates(
        1,
        torch.arange(m),
        deltas,
        torch.tensor(n),
        torch.zeros(m) if train_loss is None else train_loss,
        model,
        signals or {},
        config,
    )


def test_craft_strategy_solves_per_merged_group_on_resnet20():
    model = make_model("resnet20", (3, 8, 8), 10)
    params = get_params(model)
    gen = torch.Generator().manual_seed(1)
    deltas = {k: torch.randn(3, *v.shape, generator=gen) for k, v in params.items()}
    s = CRAFT(server_lr=1.0)
    server_s = Server(s, params)
    groups = s.groups(params, model)
    assert groups == craft_layer_groups(model) and "norm" not in groups
    new, _ = server_s.aggregate(_updates(deltas, [1, 1, 2], model))
    rho = torch.tensor([0.25, 0.25, 0.5])
    for names in groups.values():
        G = -torch.cat([deltas[n].reshape(3, -1) for n in names], dim=1)
        g = torch.cat([(params[n] - new[n]).reshape(-1) for n in names])  # server_lr = 1
        torch.testing.assert_close((G / G.norm(dim=1, keepdim=True)) @ g, rho, atol=1e-4, rtol=0)
    assert CRAFT(layerwise=False).groups(params, model) == {"model": list(params)}


def test_craft_strategy_keeps_the_unscaled_reference_between_rounds():
    model = make_model("mlp", (4,), 3, hidden=(5,))
    params = get_params(model)
    gen = torch.Generator().manual_seed(0)
    rounds = [{k: 0.1 * torch.randn(3, *v.shape, generator=gen) for k, v in params.items()} for _ in range(2)]
    n = [10, 20, 30]
    s = CRAFT(server_lr=0.5)
    server_s = Server(s, params)
    groups = layer_groups(list(params))
    rho = torch.tensor([1 / 6, 2 / 6, 3 / 6])
    p1, diag = server_s.aggregate(_updates(rounds[0], n, model))
    g1 = craft_direction({k: -v for k, v in rounds[0].items()}, rho, None, groups=groups)
    for k in params:
        torch.testing.assert_close(p1[k], params[k] - 0.5 * g1[k])
    torch.testing.assert_close(diag["weights"], rho)
    p2, _ = server_s.aggregate(_updates(rounds[1], n, model))
    g2 = craft_direction({k: -v for k, v in rounds[1].items()}, rho, g1, groups=groups)
    for k in params:
        torch.testing.assert_close(p2[k], p1[k] - 0.5 * g2[k])
    server_s = Server(s, params)  # a fresh server state forgets the reference
    p1b, _ = server_s.aggregate(_updates(rounds[0], n, model))
    for k in params:
        torch.testing.assert_close(p1b[k], p1[k])
    glob = CRAFT(server_lr=1.0, layerwise=False)
    pg, _ = Server(glob, params).aggregate(_updates(rounds[0], n, model))
    gg = craft_direction({k: -v for k, v in rounds[0].items()}, rho, groups={"model": list(params)})
    for k in params:
        torch.testing.assert_close(pg[k], params[k] - gg[k])


def test_baseline_strategies_apply_their_formulas():
    params = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    deltas = {"w": torch.tensor([[-1.0, 0.0], [0.5, -1.0]], dtype=torch.float64)}
    pseudo = -deltas["w"]
    new, _ = Server(ConFIG(server_lr=0.5), params).aggregate(_updates(deltas, [1, 1]))
    torch.testing.assert_close(new["w"], params["w"] - 0.5 * config_direction(pseudo))
    losses = torch.tensor([0.3, 0.1])
    new, _ = Server(FedFV(alpha=0.0), params).aggregate(_updates(deltas, [1, 1], signals={"global_loss": losses}))
    torch.testing.assert_close(new["w"], params["w"] - fedfv_direction(pseudo, losses, 0.0))
    new, _ = Server(FedFV(alpha=0.0, loss="local"), params).aggregate(_updates(deltas, [1, 1], train_loss=losses))
    torch.testing.assert_close(new["w"], params["w"] - fedfv_direction(pseudo, losses, 0.0))
    q = QFedAvg(q=2.0)
    server_q = Server(q, params)
    with pytest.raises(ValueError, match="lr"):
        server_q.aggregate(_updates(deltas, [1, 1], signals={"global_loss": losses}))
    config = LocalTraining(lr=0.2)
    new, _ = server_q.aggregate(_updates(deltas, [1, 1], signals={"global_loss": losses}, config=config))
    torch.testing.assert_close(new["w"], params["w"] - qfedavg_step(pseudo, losses, 0.2, 2.0))
    assert isinstance(make_strategy("craft"), CRAFT) and isinstance(make_strategy("q-fedavg"), QFedAvg)
    with pytest.raises(ValueError, match="alpha"):
        FedFV(alpha=2)
    with pytest.raises(ValueError, match="q must"):
        QFedAvg(q=-1)


def test_simulated_craft_has_no_conflicts_and_baselines_run():
    fed = federated_dataset("digits", num_clients=12, alpha=0.3, seed=1)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(32,))
    for strategy in (CRAFT(server_lr=0.3), CRAFT(server_lr=0.3, layerwise=False), ConFIG(server_lr=0.1)):
        h = simulate(
            fed, model, strategy, rounds=3, clients_per_round=5, progress=False, eval_every=3, diagnostics="conflicts"
        )
        assert (h.conflicts == 0).all()
        if isinstance(strategy, CRAFT) and strategy.layerwise:
            assert all(v == 0 for d in h.diagnostics for v in d["conflicts_per_layer"].values())
    seen = []

    class SpyQ(QFedAvg):
        def direction(self, params, updates):
            seen.append(updates.config.lr)
            return super().direction(params, updates)

    h = simulate(fed, model, SpyQ(q=1.0), rounds=2, clients_per_round=5, progress=False, lr=0.05, lr_decay=0.5)
    assert seen == pytest.approx([0.05, 0.025])  # each round's (decayed) client lr reaches the server
    assert h.diagnostics[0]["losses"].shape == (5,)
    h = simulate(fed, model, FedFV(), rounds=2, clients_per_round=5, progress=False)
    assert np.isfinite(h.client_accuracy).all()


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_craft_layer_groups_refuses_a_merge_norm_that_is_not_a_bool(flag):
    """``merge_norm="no"`` was truthy and merged the norm layers."""
    from fedlearn_edu.models import make_model

    with pytest.raises(TypeError, match=rf"merge_norm must be True or False, got {flag!r}"):
        craft_layer_groups(make_model("mlp", (1, 8, 8), 10), merge_norm=flag)


def test_craft_layer_groups_merge_groupnorm_into_its_convolution():
    model = make_model("resnet20", (3, 32, 32), 10)
    groups = craft_layer_groups(model)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(sum(groups.values(), [])) == sorted(names)
    assert groups["blocks.0.conv1"] == ["blocks.0.conv1.weight", "blocks.0.norm1.weight", "blocks.0.norm1.bias"]
    assert groups["blocks.3.shortcut.0"] == [
        "blocks.3.shortcut.0.weight",
        "blocks.3.shortcut.1.weight",
        "blocks.3.shortcut.1.bias",
    ]
    assert len(groups) == 22 and len(craft_layer_groups(model, merge_norm=False)) == 43
    mlp = make_model("mlp", (1, 8, 8), 10)
    assert craft_layer_groups(mlp) == layer_groups([n for n, _ in mlp.named_parameters()])

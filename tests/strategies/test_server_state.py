"""The explicit server state: aggregate is pure for every strategy; compositions that cannot work are refused."""

from __future__ import annotations

import copy

import pytest
import torch

from fedlearn_edu import IFCA, Ditto, FedAvg, FedVG, LocalOnly, federated_dataset, make_model
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.engine import LocalTraining, make_engine
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import DAC, SCAFFOLD, STRATEGIES, ClientUpdates, ClientWork, FedAvgM, Gossip


@pytest.fixture(scope="module")
def setting():
    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)
    fed, val = server_validation_split(fed, fraction=0.2, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    return fed, val, model


def _all_strategies(val):
    made = {}
    for name, cls in STRATEGIES.items():
        if name in ("ditto", "ifca", "local"):  # built below
            continue
        made[name] = cls(val, engine="loop") if name == "fedvg" else cls(num_neighbours=2) if name == "dac" else cls()
    made.update(
        ditto=Ditto(0.5),
        ditto_fedvg=Ditto(0.5, base=FedVG(val, engine="loop")),
        fedvg_scaffold=FedVG(val, base=SCAFFOLD(), engine="loop"),
        fedvg_fedavgm=FedVG(val, base=FedAvgM(), engine="loop"),
        ifca=IFCA(2),
        local=LocalOnly(),
    )
    return made


def _same(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.nn.Module):
        _same(dict(a.state_dict()), dict(b.state_dict()), path)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        _same(vars(a), vars(b), path)
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, path


def _round(strategy, fed, model, server_state, client_state, t=1):
    """The updates of round t's clients (0, 2, 3, 5), as the driver computes them."""
    ids = torch.tensor([0, 2, 3, 5])
    train_sets = [(c.train_x, c.train_y) for c in fed]
    config = strategy.configure_local(LocalTraining(1, 16, 0.05))
    engine = make_engine("loop", model)
    work = ClientWork.for_round(t, ids, train_sets, config, model, engine, 0, fed.num_train_samples)
    rows = {
        k: (v[ids] if not isinstance(v, dict) else {n: x[ids] for n, x in v.items()}) for k, v in client_state.items()
    }
    out = strategy.client_update(work, server_state, rows)
    return ClientUpdates(t, ids, out.deltas, fed.num_train_samples[ids], out.train_loss, model, out.signals, config)


@pytest.mark.parametrize("name", sorted(_all_strategies((torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)))))
def test_aggregate_is_a_pure_function_of_the_server_state_and_the_updates(setting, name):
    """Twice on the same inputs: bitwise the same new state and diagnostics; the strategy object,
    the server state and the updates are unchanged (every registered strategy, and the compositions)."""
    fed, val, model = setting
    strategy = _all_strategies(val)[name]
    server_state, client_state = strategy.init_state(get_params(model), model, len(fed), 0)
    for t in (1, 2):  # round 2 starts from a state that has moved (moments, references, c, ...)
        updates = _round(strategy, fed, model, server_state, client_state, t)
        before = copy.deepcopy(vars(strategy))
        state_before, updates_before = copy.deepcopy(server_state), copy.deepcopy(updates)
        first, diag1 = strategy.aggregate(server_state, updates)
        second, diag2 = strategy.aggregate(server_state, updates)
        _same(first, second, "server_state")
        _same(diag1, diag2, "diagnostics")
        _same(state_before, server_state, "input server_state")
        _same(vars(updates_before), vars(updates), "input updates")
        _same(before, vars(strategy), "strategy")
        if strategy.needs.server_model != "none":
            moved = strategy.server_params(first)
            assert any(not torch.equal(moved[k], strategy.server_params(server_state)[k]) for k in moved)
        server_state = first


@pytest.mark.parametrize(
    "outer",
    [lambda base, val: Ditto(0.1, base=base), lambda base, val: FedVG(val, base=base)],
    ids=["ditto", "fedvg"],
)
@pytest.mark.parametrize(
    "base, inner",
    [
        (lambda val: IFCA(2), "ifca"),
        (lambda val: Gossip(), "gossip"),
        (lambda val: DAC(), "dac"),
        (lambda val: LocalOnly(), "local"),
        (lambda val: Ditto(0.1), "ditto"),
    ],
)
def test_compositions_that_cannot_work_are_refused_naming_both(setting, outer, base, inner):
    _, val, _ = setting
    outer_name = "Ditto" if outer(FedAvg(), val).name.startswith("ditto") else "FedVG"
    with pytest.raises(ValueError, match=f"{outer_name} over {inner}"):
        outer(base(val), val)


def test_fedvg_over_fedvg_and_non_strategies_are_refused(setting):
    _, val, _ = setting
    with pytest.raises(ValueError, match="FedVG over FedVG"):
        FedVG(val, base=FedVG(val))
    with pytest.raises(TypeError, match="Ditto's base must be a fedlearn_edu Strategy"):
        Ditto(0.1, base=object())
    # what does compose: Ditto over FedVG over SCAFFOLD, nested state
    s = Ditto(0.1, base=FedVG(val, base=SCAFFOLD()))
    state, clients = s.init_state({"w": torch.zeros(3)}, None, 4, 0)
    assert set(state) == {"base"} and set(state["base"]) == {"base"}
    assert {"params", "optimizer", "control", "num_clients"} == set(state["base"]["base"])
    assert set(clients) == {"control", "personal"}


def test_one_strategy_object_runs_two_identical_simulations(setting):
    """The strategy holds no run state: reusing it (after a run) gives the same run, and a run
    leaves the object as it was."""
    from fedlearn_edu import simulate

    fed, val, model = setting
    strategy = Ditto(0.5, base=FedVG(val, base=SCAFFOLD(), engine="loop"))
    before = copy.deepcopy(vars(strategy))
    kw = dict(rounds=2, clients_per_round=3, batch_size=16, lr=0.05, engine="loop", device="cpu", progress=False)
    first, second = simulate(fed, model, strategy, **kw), simulate(fed, model, strategy, **kw)
    _same(before, vars(strategy), "strategy")
    _same(first.final_params, second.final_params, "final_params")
    _same(first.final_server_state, second.final_server_state, "final_server_state")
    _same(first.final_state, second.final_state, "final_state")

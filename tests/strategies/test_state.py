"""Typed server states (fedlearn_edu/strategies/state.py): every strategy keeps one through its rounds,
a name a state does not declare is refused, a state reads like the dict of its fields, moves between
devices and resumes from a checkpoint typed, and a user's dict state still runs."""

import dataclasses

import pytest
import torch

from fedlearn_edu import CRAFT, SCAFFOLD, DPFedAvg, FedAvg, federated_dataset, make_model, simulate
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.engine import LocalTraining, make_engine
from fedlearn_edu.params import get_params, select_rows, to_device
from fedlearn_edu.strategies import STRATEGIES, ClientUpdates, ClientWork, Ditto, FedVG, Wrapper
from fedlearn_edu.strategies.state import (
    AdaptiveDPState,
    CRAFTState,
    DPState,
    ModelState,
    SCAFFOLDState,
    ServerState,
    WrapperState,
    load_state,
    updated,
)

KW = dict(rounds=3, clients_per_round=4, lr=0.05, batch_size=16, seed=1, progress=False, device="cpu")


@pytest.fixture(scope="module")
def setting():
    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)
    fed, val = server_validation_split(fed, fraction=0.2, seed=0)
    return fed, val


def _model(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)


def _strategy(name, val):
    cls = STRATEGIES[name]
    if name == "fedvg":
        return cls(val, engine="loop")
    if name == "dac":
        return cls(num_neighbours=2)
    if name == "ifca":
        return cls(2)
    return cls()


def _updates(strategy, fed, model, server_state, client_state):
    ids = torch.tensor([0, 2, 3, 5])
    train_sets = [(c.train_x, c.train_y) for c in fed]
    config = strategy.configure_local(LocalTraining(1, 16, 0.05))
    work = ClientWork.for_round(1, ids, train_sets, config, model, make_engine("loop", model), 0, fed.num_train_samples)
    out = strategy.client_update(work, server_state, select_rows(client_state, ids))
    return ClientUpdates(1, ids, out.deltas, fed.num_train_samples[ids], out.train_loss, model, out.signals, config)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_registered_strategy_keeps_a_typed_frozen_server_state_through_a_round(setting, name):
    """init_state gives a ServerState (a wrapper's holds its base's, typed too), aggregate returns one of
    the same class, and a field cannot be assigned. Failed before: the states were plain dicts."""
    fed, val = setting
    model = _model(fed)
    strategy = _strategy(name, val)
    server_state, client_state = strategy.init_state(get_params(model), model, len(fed), 0)
    assert isinstance(server_state, ServerState), type(server_state)
    if isinstance(server_state, WrapperState):
        assert isinstance(server_state.base, ServerState)
    new, _ = strategy.aggregate(server_state, _updates(strategy, fed, model, server_state, client_state))
    assert type(new) is type(server_state)
    for field in dataclasses.fields(server_state):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(server_state, field.name, None)


def test_a_name_the_state_does_not_declare_is_refused_not_added(setting):
    """A misspelt entry was a new dict key before (``{**state, "referense": ...}``): the run went on with
    CRAFT's reference unchanged. Now the state refuses it, naming its fields."""
    fed, _ = setting

    class Misspelt(CRAFT):
        def direction(self, server_state, updates):
            g, server_state, diag = super().direction(server_state, updates)
            return g, updated(server_state, referense=None), diag

    with pytest.raises(TypeError, match=r"CRAFTState has no field 'referense'; its fields are \['params', "):
        simulate(fed, _model(fed), Misspelt(), **KW)
    state = CRAFTState(params={}, optimizer={}, reference=None)
    with pytest.raises(TypeError, match="has no field 'control'"):
        state.replace(control={})


def test_a_state_reads_like_the_dict_of_its_fields():
    params, g = {"w": torch.ones(2)}, {"w": torch.zeros(2)}
    state = CRAFTState(params=params, optimizer={}, reference=None)
    assert list(state) == ["params", "optimizer", "reference"] and len(state) == 3
    assert state["params"] is state.params is params and dict(state) == {**state}
    assert state.get("reference", "absent") is None and "control" not in state
    with pytest.raises(KeyError):
        state["control"]
    new = updated(state, reference=g)
    assert type(new) is CRAFTState and new.reference is g and state.reference is None  # the caller's is kept
    assert updated({"params": params}, params=g) == {"params": g}  # a client view (a dict) stays a dict
    assert "CRAFTState(params, optimizer, reference)" == repr(state)


def test_a_typed_state_moves_to_a_device_and_loads_from_its_dict_typed():
    state = WrapperState(
        base=SCAFFOLDState(params={"w": torch.ones(2)}, optimizer={}, control={"w": torch.zeros(2)}, num_clients=4)
    )
    moved = to_device(state, "cpu")
    assert type(moved) is WrapperState and type(moved.base) is SCAFFOLDState and moved.base.num_clients == 4
    saved = {
        "base": {
            "params": {"w": torch.full((2,), 3.0)},
            "optimizer": {},
            "control": {"w": torch.ones(2)},
            "num_clients": 4,
        }
    }
    loaded = load_state(state, saved)
    assert type(loaded) is WrapperState and type(loaded.base) is SCAFFOLDState
    assert torch.equal(loaded.base.params["w"], torch.full((2,), 3.0))
    assert load_state({"params": None}, {"params": 1}) == {"params": 1}  # a user's dict state stays a dict


def test_a_checkpoint_stores_the_dict_of_the_fields_and_resumes_the_typed_state(setting, tmp_path):
    """The file's layout is the dict the states were before (old files resume); the resumed run's state is typed."""
    fed, val = setting
    path = tmp_path / "run.pt"
    make = lambda: FedVG(val, base=SCAFFOLD(), engine="loop")  # noqa: E731
    full = simulate(fed, _model(fed), make(), **dict(KW, rounds=3))
    simulate(fed, _model(fed), make(), checkpoint=path, **dict(KW, rounds=2))
    saved = torch.load(path, weights_only=True)["server_state"]
    assert type(saved) is dict and type(saved["base"]) is dict
    assert list(saved["base"]) == ["params", "optimizer", "control", "num_clients"]
    resumed = simulate(fed, _model(fed), make(), checkpoint=path, resume=True, **dict(KW, rounds=3))
    state = resumed.final_server_state
    assert type(state) is WrapperState and type(state.base) is SCAFFOLDState
    for k, v in full.final_server_state.base.control.items():
        assert torch.equal(v, state.base.control[k])


def test_dp_fedavg_declares_the_clip_only_when_it_adapts():
    params = {"w": torch.zeros(3)}
    model = torch.nn.Linear(1, 1)
    fixed, _ = DPFedAvg(0.5, 1.0).init_state(params, model, 4, 7)
    adaptive, _ = DPFedAvg(0.5, 1.0, target_quantile=0.5, count_noise=5.0).init_state(params, model, 4, 7)
    assert type(fixed) is DPState and list(fixed) == ["params", "optimizer", "noise_seed"]
    assert type(adaptive) is AdaptiveDPState and adaptive.clip == 0.5 and adaptive.noise_seed == 7


def test_a_user_strategy_may_keep_a_dict_and_a_wrapper_over_it_nests_it(setting, tmp_path):
    """The package's states are typed; a user's strategy that keeps a plain dict runs, checkpoints and
    resumes, under a Wrapper (typed) and Ditto too."""
    fed, _ = setting

    class Counting(FedAvg):
        def init_state(self, params, model, num_clients, seed):
            server, clients = super().init_state(params, model, num_clients, seed)
            return {**server, "rounds": torch.zeros((), dtype=torch.long)}, clients

        def direction(self, server_state, updates):
            g, server_state, diag = super().direction(server_state, updates)
            return g, {**server_state, "rounds": server_state["rounds"] + 1}, diag

    for make in (Counting, lambda: Wrapper(Counting()), lambda: Ditto(0.5, base=Counting())):
        path = tmp_path / "run.pt"
        path.unlink(missing_ok=True)
        simulate(fed, _model(fed), make(), checkpoint=path, **dict(KW, rounds=2))
        h = simulate(fed, _model(fed), make(), checkpoint=path, resume=True, **KW)
        state = h.final_server_state
        inner = state if isinstance(state, dict) else state.base
        assert type(inner) is dict and int(inner["rounds"]) == 3
        assert isinstance(FedAvg().init_state(get_params(_model(fed)), _model(fed), 2, 0)[0], ModelState)


def test_a_field_that_would_hide_a_method_of_the_state_is_refused():
    with pytest.raises(TypeError, match="may not declare a field named 'values'.*Name the field otherwise"):

        @dataclasses.dataclass(frozen=True, kw_only=True)
        class Bad(ModelState):
            values: torch.Tensor

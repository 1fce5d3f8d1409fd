"""The strategy registry: registration, make_strategy's names and bases, user strategies; over every registered
strategy, the explicit server state (aggregate is pure) and the compositions that cannot work."""

import copy
import importlib
import inspect
import pkgutil
from collections.abc import Mapping

import pytest
import torch

import fedlearn_edu.strategies as strategies
from fedlearn_edu import (
    CRAFT,
    IFCA,
    Ditto,
    FedAvg,
    FedProx,
    FedVG,
    LocalOnly,
    federated_dataset,
    make_model,
    make_strategy,
)
from fedlearn_edu.cli import main as cli_main
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.engine import LocalTraining, make_engine
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import (
    DAC,
    SCAFFOLD,
    STRATEGIES,
    ClientUpdates,
    ClientWork,
    FedAvgM,
    Gossip,
    Strategy,
    register,
    strategy_parameters,
)
from tests.user_strategy import restored_registry, write_user_module


@pytest.fixture
def registry():
    """Restore the registry after a test that registers classes."""
    with restored_registry():
        yield


def user_module(tmp_path, monkeypatch, module="my_strategies", name="halved"):
    """A user's strategy module written to ``tmp_path`` and importable as ``module``."""
    return write_user_module(tmp_path, monkeypatch, module, name)


def test_make_strategy_builds_ditto_ifca_and_local_only():
    """Failed before: STRATEGIES left out Ditto, IFCA and LocalOnly ("Unknown strategy 'ditto'")."""
    assert {"ditto", "ifca", "local"} <= set(STRATEGIES)
    ditto = make_strategy("ditto")
    assert isinstance(ditto, Ditto) and type(ditto.base) is FedAvg and ditto.name == "ditto"
    assert repr(ditto) == repr(Ditto())
    ifca = make_strategy("IFCA", num_clusters=3)
    assert isinstance(ifca, IFCA) and ifca.num_clusters == 3
    assert isinstance(make_strategy("local"), LocalOnly)


def test_every_concrete_strategy_of_the_package_is_registered():
    seen = []
    for info in pkgutil.iter_modules(strategies.__path__):
        module = importlib.import_module(f"fedlearn_edu.strategies.{info.name}")
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls is not Strategy and issubclass(cls, Strategy) and "name" in cls.__dict__:
                assert STRATEGIES[cls.name] is cls, cls
                seen.append(cls)
    assert len(set(seen)) == len(STRATEGIES) >= 32


def test_strategies_is_a_read_only_view():
    with pytest.raises(TypeError):
        STRATEGIES["mine"] = FedAvg  # type: ignore[index]
    assert {cls.__name__ for cls in STRATEGIES.values()} <= set(strategies.__all__)


def test_a_base_by_name_or_object_and_the_arguments_it_takes():
    by_name = make_strategy("ditto", base="craft", lam=0.5)
    assert by_name.name == "ditto+craft" and isinstance(by_name.base, CRAFT) and by_name.lam == 0.5
    assert repr(by_name) == repr(Ditto(0.5, base=CRAFT()))
    assert repr(make_strategy("ditto", base=CRAFT(server_lr=2.0))) == repr(Ditto(base=CRAFT(server_lr=2.0)))
    # with a base's name, what the base's constructor takes goes to the base
    assert repr(make_strategy("ditto", base="fedprox", mu=0.3, lam=2.0)) == repr(Ditto(2.0, base=FedProx(mu=0.3)))
    # Ditto's default base is FedAvg, built with what Ditto does not take (the benchmark's Ditto)
    assert repr(make_strategy("ditto", server_lr=2.0, lam=3.0)) == repr(Ditto(3.0, base=FedAvg(server_lr=2.0)))
    fedvg = make_strategy("fedvg", val_data=_val(), base="fedprox", mu=0.1, server_lr=0.5, engine="loop")
    assert isinstance(fedvg.base, FedProx) and fedvg.base.mu == 0.1 and fedvg.server_lr == 0.5
    assert set(strategy_parameters("ditto")) == {"lam", "personal_epochs", "server_lr", "optimizer"}


def _val():

    return torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)


@pytest.mark.parametrize("name", ["fedavg", "ifca", "local", "gossip"])
def test_a_strategy_without_a_base_refuses_base(name):
    with pytest.raises(TypeError, match=rf"{name} takes no base strategy.*drop base=.*\['ditto', 'fedvg'\]"):
        make_strategy(name, base="fedavg")


def test_an_argument_neither_takes_is_refused_by_name():
    with pytest.raises(TypeError, match="ditto takes no argument 'nope'.*'lam'"):
        make_strategy("ditto", nope=1)
    with pytest.raises(TypeError, match="local takes no argument 'mu'"):
        make_strategy("local", mu=0.1)
    with pytest.raises(ValueError, match="Unknown strategy 'nope'"):
        make_strategy("ditto", base="nope")


@pytest.mark.parametrize("name", [None, 3, FedAvg, ("fedavg",), b"fedavg", ["fedavg"]])
def test_make_strategy_refuses_a_name_that_is_not_a_string(name):
    with pytest.raises(TypeError, match=r"name must be a strategy's short name \(a str, e.g. 'fedavg'\), got") as err:
        make_strategy(name)
    assert repr(name) in str(err.value)


def test_a_user_strategy_registers_with_one_decorator(tmp_path, monkeypatch, registry):
    module = importlib.import_module(user_module(tmp_path, monkeypatch))
    strategy = make_strategy("Halved", server_lr=3.0)
    assert type(strategy) is module.Halved and strategy.server_lr == 1.5
    assert STRATEGIES["halved"] is module.Halved
    # the same class again (a re-imported module, a notebook cell run twice) replaces its entry
    again = importlib.reload(module)
    assert STRATEGIES["halved"] is again.Halved


def test_a_taken_name_is_refused(tmp_path, monkeypatch, registry):
    importlib.import_module(user_module(tmp_path, monkeypatch))
    with pytest.raises(ValueError, match="name 'fedavg' of .*Clash is taken by fedlearn_edu.strategies.fedavg.FedAvg"):

        @register
        class Clash(FedAvg):
            name = "fedavg"

    with pytest.raises(ValueError, match="'halved' of other_strategies.Halved is taken by my_strategies.Halved"):
        importlib.import_module(user_module(tmp_path, monkeypatch, module="other_strategies"))
    assert STRATEGIES["fedavg"] is FedAvg


@pytest.mark.parametrize(
    ("name", "fix"), [("Mine", "use 'mine'"), ("my_rule", "use 'myrule'"), ("my rule", "lowercase letters"), ("", "")]
)
def test_a_name_that_does_not_normalise_is_refused(name, fix, registry):
    with pytest.raises(ValueError, match=f"name {name!r} is not a registry name.*{fix}"):
        register(type("Rule", (FedAvg,), {"name": name}))
    assert name not in STRATEGIES


def test_register_refuses_what_it_cannot_register(registry):
    with pytest.raises(TypeError, match="must set its own short name"):
        register(type("Unnamed", (FedAvg,), {}))  # inherits FedAvg's name: would replace FedAvg
    with pytest.raises(TypeError, match="takes a Strategy subclass"):
        register(dict)


def test_local_only_refuses_a_server_step_when_built_directly():
    """Local-only training has no server model: ``LocalOnly(server_lr=...)`` is an error, not ignored."""
    from fedlearn_edu import LocalOnly

    with pytest.raises(TypeError):
        LocalOnly(server_lr=0.5)
    assert repr(LocalOnly()) == "LocalOnly(optimizer=ServerSGD(lr=1.0))"


NAMES = ("scaffold", "feddyn", "fednova", "afl", "fedlf", "gossip", "dac")


# ----------------------------------------------------------------- registration
def test_every_baseline_is_a_registered_strategy_and_runs_from_the_cli(capsys):
    for name in NAMES:
        assert name in STRATEGIES
        assert make_strategy(name).name == name
    rc = cli_main(["run", "--strategy", "scaffold", "--clients", "6", "--clients-per-round", "3", "--rounds", "1",
                   "--no-progress"])  # fmt: skip
    assert rc in (0, None)
    assert "scaffold" in capsys.readouterr().out


# The explicit server state: aggregate is pure for every strategy; compositions that cannot work are refused.


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
    elif isinstance(a, Mapping):  # a dict or a typed server state
        assert type(a) is type(b) and a.keys() == b.keys(), path
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

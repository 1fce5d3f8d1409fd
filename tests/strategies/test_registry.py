"""The strategy registry: registration, make_strategy's names and bases, user strategies."""

import importlib
import inspect
import pkgutil

import pytest
import torch

import fedlearn_edu.strategies as strategies
from fedlearn_edu import (
    CRAFT,
    IFCA,
    Ditto,
    FedAvg,
    FedProx,
    LocalOnly,
    make_strategy,
)
from fedlearn_edu.cli import main as cli_main
from fedlearn_edu.strategies import STRATEGIES, Strategy, register, strategy_parameters
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


@pytest.mark.parametrize("name", [None, 3, FedAvg, ("fedavg",)])
def test_make_strategy_refuses_a_name_that_is_not_a_string(name):
    with pytest.raises(TypeError, match=r"name must be a strategy's short name \(a str"):
        make_strategy(name)


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

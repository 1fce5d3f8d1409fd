"""The strategy base (:mod:`fedlearn_edu.strategies.base`): a bad server_lr is refused by name, and so are
compositions that cannot work (a wrapper over a base without one global model, or already personalised)."""

import inspect
import math

import pytest

from fedlearn_edu import DAC, IFCA, Ditto, FedAvg, FedAvgM, FedVG, Gossip, LocalOnly
from fedlearn_edu.strategies.base import Strategy


def test_server_lr_as_a_string_names_the_argument():
    with pytest.raises(TypeError, match="server_lr"):
        FedAvg(server_lr="1")
    with pytest.raises(ValueError, match="server_lr"):
        FedAvg(server_lr=math.nan)


@pytest.mark.parametrize("outer", ["ditto", "fedvg"])
@pytest.mark.parametrize("inner", ["ifca", "gossip", "local", "ditto", "dac"])
def test_compositions_that_cannot_work_are_refused_at_construction(setting, outer, inner):
    _, _, val, _ = setting
    base = {"ifca": lambda: IFCA(2), "gossip": Gossip, "local": LocalOnly, "ditto": lambda: Ditto(0.1), "dac": DAC}[
        inner
    ]()
    with pytest.raises(ValueError, match="cannot work"):
        Ditto(0.1, base=base) if outer == "ditto" else FedVG(val, base=base, engine="loop")


# ----------------------------------------------------------------------------- the explicit protocol
def test_a_strategy_without_its_required_hook_fails_at_construction_naming_it():
    """Was: ``NotImplementedError`` when the run first reached ``direction``, rounds after the start."""

    class Forgot(Strategy):
        name = "forgot"

        def configure_local(self, config):
            return config

    # Python's message: "... abstract class Forgot with abstract method direction" (3.12: "... 'direction'")
    with pytest.raises(TypeError, match=r"abstract class Forgot .*abstract method '?direction"):
        Forgot()
    with pytest.raises(TypeError, match=r"abstract class Strategy .*abstract method '?direction"):
        Strategy()

    class Defined(Strategy):  # the documented plugin: direction alone
        def direction(self, server_state, updates):
            return FedAvg().direction(server_state, updates)

    assert Defined().server_lr == 1.0
    # the constructor's signature is still the class's own (make_strategy and the registry read it)
    assert list(inspect.signature(Defined).parameters) == ["server_lr", "optimizer"]
    assert "momentum" in inspect.signature(FedAvgM).parameters


def test_the_hooks_are_required_or_documented_as_optional():
    """Every public method of the protocol is one or the other, and says which in its docstring."""
    from fedlearn_edu.strategies.base import OPTIONAL_HOOKS, REQUIRED_HOOKS

    assert Strategy.__abstractmethods__ == frozenset(REQUIRED_HOOKS) == {"direction"}
    public = {k for k, v in vars(Strategy).items() if callable(v) and not k.startswith("_")}
    assert public == set(REQUIRED_HOOKS) | set(OPTIONAL_HOOKS)
    for hook in OPTIONAL_HOOKS:
        assert "Optional hook" in getattr(Strategy, hook).__doc__, hook
    assert "required hook" in Strategy.direction.__doc__


@pytest.mark.parametrize(
    "make",
    [
        lambda opt: FedAvg(server_lr=0.5, optimizer=opt),
        lambda opt: __import__("fedlearn_edu").FedProx(0.1, server_lr=0.5, optimizer=opt),
        lambda opt: __import__("fedlearn_edu").Median(server_lr=0.5, optimizer=opt),
        lambda opt: __import__("fedlearn_edu").DPFedAvg(server_lr=0.5, optimizer=opt),
        lambda opt: __import__("fedlearn_edu").FedNova(server_lr=0.5, optimizer=opt),
    ],
    ids=["FedAvg", "FedProx", "Median", "DPFedAvg", "FedNova"],
)
def test_server_lr_beside_an_optimizer_is_refused_with_what_to_do(make):
    """Was: ``FedAvg(server_lr=0.5, optimizer=chain(...))`` silently dropped the 0.5."""
    from fedlearn_edu import chain, clip_by_global_norm, sgd

    with pytest.raises(ValueError, match=r"server_lr=0\.5 and optimizer=.*give the step inside the optimizer"):
        make(chain(clip_by_global_norm(1.0), sgd(1.0)))
    assert FedAvg(optimizer=chain(sgd(0.5))).server_lr == 0.5 and FedAvg(server_lr=0.5).server_lr == 0.5
    assert FedAvg().server_lr == 1.0 and FedAvg(server_lr=None).server_lr == 1.0


def test_fedvg_refuses_a_step_its_optimizer_or_base_would_override(setting):
    from fedlearn_edu import ServerMomentum

    _, _, val, _ = setting
    with pytest.raises(ValueError, match=r"server_lr=0\.5 beside optimizer="):
        FedVG(val, server_lr=0.5, optimizer=ServerMomentum(1.0, 0.9))
    with pytest.raises(ValueError, match=r"server_momentum=0\.5 beside optimizer="):
        FedVG(val, server_momentum=0.5, optimizer=ServerMomentum(1.0, 0.9))
    with pytest.raises(ValueError, match=r"server_lr=0\.5 with base=FedAvg: .*base=FedAvg\(server_lr=\.\.\.\)"):
        FedVG(val, server_lr=0.5, base=FedAvg())
    assert FedVG(val, server_lr=0.5).server_lr == 0.5 and FedVG(val, base=FedAvg(server_lr=0.5)).server_lr == 0.5


@pytest.mark.parametrize("name, scaler", [("FedAdam", "scale_by_adam"), ("FedYogi", "scale_by_yogi"), ("FedAvgM", "")])
def test_a_strategy_named_for_its_optimizer_refuses_optimizer_with_the_fix(name, scaler):
    """Was: ``TypeError: __init__() got an unexpected keyword argument 'optimizer'``."""
    import fedlearn_edu as fl

    with pytest.raises(TypeError, match=rf"^{name} takes no optimizer .*use FedAvg\(optimizer=\.\.\.\), e\.g\. FedAvg"):
        getattr(fl, name)(optimizer=fl.ServerSGD(1.0))
    if scaler:
        with pytest.raises(TypeError, match=rf"{scaler}\(lr=0\.01\)"):
            fl.make_strategy(name.lower(), optimizer=fl.sgd(1.0))
    assert getattr(fl, name)(optimizer=None).server_lr > 0

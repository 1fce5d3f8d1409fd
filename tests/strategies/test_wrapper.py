"""Strategies built on another strategy: a researcher's own wrapper runs over every one-model base.

``Forwarding`` is written the way a researcher writes "my method on top of any strategy" with
the protocol alone (as FedVG and Ditto were): it nests the base's server state under
``"base"``, forwards the client side and evaluation, takes the base's direction (its own step
is a no-op) and lets the base apply it. Over Ditto it used to die with ``KeyError: None``
(``Strategy.apply`` indexed ``server_state[self.model_key]`` and Ditto's was ``None``), and over
``AFL(iterate="average")`` it silently never updated the averaged iterate (AFL kept it in an
``aggregate`` override, which a wrapper applying the base's step never ran). ``NoOp`` and
``OwnDirection`` are the same wrappers on :class:`~fedlearn_edu.strategies.Wrapper`, which
need nothing but what they change.
"""

from __future__ import annotations

import pytest
import torch

from fedlearn_edu import AFL, SCAFFOLD, Ditto, DPFedAvg, FedAvg, FedVG, LocalOnly, simulate
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.strategies import FedDyn, Gossip, Needs, Wrapper
from fedlearn_edu.strategies.base import ClientUpdates, Strategy

RUN = dict(rounds=3, clients_per_round=4, local_epochs=1, batch_size=16, lr=0.05, seed=1, progress=False)


class Forwarding(Strategy):
    """A no-op wrapper over any strategy, written with the protocol alone."""

    def __init__(self, base: Strategy):
        super().__init__(optimizer=base.optimizer)
        self.base = base

    @property
    def needs(self):
        return self.base.needs

    @property
    def evaluates(self):
        return self.base.evaluates

    def init_state(self, params, model, num_clients, seed):
        base, clients = self.base.init_state(params, model, num_clients, seed)
        return {"base": base}, clients

    def server_params(self, server_state):
        return self.base.server_params(server_state["base"])

    def client_view(self, server_state):
        return {"base": self.base.client_view(server_state["base"])}

    def configure_local(self, config):
        return self.base.configure_local(config)

    def client_update(self, work, server_state, state):
        return self.base.client_update(work, server_state["base"], state)

    def direction(self, server_state, updates: ClientUpdates):
        g, base, diag = self.base.direction(server_state["base"], updates)
        return g, {**server_state, "base": base}, diag

    def aggregate(self, server_state, updates: ClientUpdates):
        g, server_state, diag = self.direction(server_state, updates)
        return {**server_state, "base": self.base.apply(server_state["base"], g, updates)}, diag

    def eval_models(self, model, server_state, state, train_sets):
        return self.base.eval_models(model, server_state["base"], state, train_sets)


class NoOp(Wrapper):
    """A wrapper that changes nothing (every hook is the base's)."""


class OwnDirection(Wrapper):
    """A wrapper whose own server step is a no-op: the base's direction, unchanged."""

    wraps = {"server"}

    def direction(self, server_state, updates):
        return super().direction(server_state, updates)


class Halved(Wrapper):
    """A user's wrapper that overrides only the direction: half of the base's."""

    wraps = {"server"}

    def direction(self, server_state, updates):
        g, server_state, diag = super().direction(server_state, updates)
        return {k: v / 2 for k, v in g.items()}, server_state, diag


WRAPPERS = [Forwarding, NoOp, OwnDirection]


def _same_run(a, b) -> None:
    """Two Histories of the same run: bitwise the same accuracies, losses and final model."""
    assert a.evaluated == b.evaluated
    assert torch.equal(torch.as_tensor(a.client_accuracy), torch.as_tensor(b.client_accuracy))
    assert a.other_accuracy.keys() == b.other_accuracy.keys()
    for k in a.other_accuracy:
        assert torch.equal(torch.as_tensor(a.other_accuracy[k]), torch.as_tensor(b.other_accuracy[k])), k
    assert torch.equal(torch.as_tensor(a.train_loss), torch.as_tensor(b.train_loss))
    for k in a.final_params:
        assert torch.equal(a.final_params[k], b.final_params[k]), k


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_forwarding_wrapper_runs_over_ditto_as_ditto_does(fed, mlp, wrapper):
    """Bug: ``KeyError: None`` from ``Strategy.apply`` (Ditto's ``model_key``) on the first server step."""
    model = mlp(fed)
    _same_run(simulate(fed, model, wrapper(Ditto(0.5)), **RUN), simulate(fed, model, Ditto(0.5), **RUN))


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_forwarding_wrapper_over_afl_average_updates_the_averaged_iterate(fed, mlp, wrapper):
    """Bug: the wrapper never ran AFL's running average (``num_averaged`` stayed 0), and nothing said so."""
    model = mlp(fed)
    afl = AFL(lambda_lr=0.5, iterate="average")
    wrapped = wrapper(afl)
    state, _ = wrapped.init_state(dict(model.named_parameters()), model, len(fed), 0)
    alone, _ = afl.init_state(dict(model.named_parameters()), model, len(fed), 0)
    deltas = {k: 0.01 * torch.ones(2, *v.shape) for k, v in model.named_parameters()}
    for t in (1, 2, 3):
        updates = ClientUpdates(
            t, torch.tensor([0, 3]), {k: t * v for k, v in deltas.items()}, torch.tensor([30, 30]),
            torch.ones(2), model, {"global_loss": torch.tensor([0.5, 1.5 * t])},
        )  # fmt: skip
        state, _ = wrapped.aggregate(state, updates)
        alone, _ = afl.aggregate(alone, updates)
    assert state["base"]["num_averaged"] == alone["num_averaged"] == 3
    for k, v in alone["average"].items():
        assert torch.equal(state["base"]["average"][k], v), k
    _same_run(simulate(fed, model, wrapped, **RUN), simulate(fed, model, afl, **RUN))


@pytest.mark.parametrize(
    "wrapped,equivalent",
    [
        (lambda: Halved(FedAvg()), lambda: FedAvg(server_lr=0.5)),
        (lambda: Halved(SCAFFOLD()), lambda: SCAFFOLD(server_lr=0.5)),
        (lambda: Halved(Ditto(0.5)), lambda: Ditto(0.5, base=FedAvg(server_lr=0.5))),
    ],
    ids=["fedavg", "scaffold", "ditto"],
)
def test_a_wrapper_overriding_only_the_direction_works_over_any_base(fed, mlp, wrapped, equivalent):
    """Half of the base's direction under SGD(1) is the base at server_lr 0.5, bit for bit (g / 2 == 0.5 g)."""
    model = mlp(fed)
    strategy = wrapped()
    server, clients = strategy.init_state(dict(model.named_parameters()), model, len(fed), 0)
    assert list(server) == ["base"]
    assert clients.keys() == equivalent().init_state(dict(model.named_parameters()), model, len(fed), 0)[1].keys()
    assert repr(strategy).startswith("Halved(optimizer=") and repr(strategy).endswith(f"base={strategy.base!r})")
    _same_run(simulate(fed, model, strategy, **RUN), simulate(fed, model, equivalent(), **RUN))


def test_fedvg_over_fedavg_is_fedvg_alone_bit_for_bit(fed, mlp):
    """FedVG on the wrapper base: over FedAvg (nested state) the same run as alone (flat state, the
    formula of tests/strategies/test_fedvg.py); over AFL it keeps AFL's averaged iterate."""
    fed, val = server_validation_split(fed, fraction=0.2, seed=0)
    model = mlp(fed)
    alone = FedVG(val, engine="loop")
    over = FedVG(val, base=FedAvg(), engine="loop")
    assert list(alone.init_state(dict(model.named_parameters()), model, len(fed), 0)[0]) == ["params", "optimizer"]
    _same_run(simulate(fed, model, over, **RUN), simulate(fed, model, alone, **RUN))
    afl = FedVG(val, base=AFL(iterate="average"), engine="loop")
    state, _ = afl.init_state(dict(model.named_parameters()), model, len(fed), 0)
    models = []
    for t in (1, 2):
        deltas = {
            k: (0.01 * t) * torch.randn(2, *v.shape, generator=torch.Generator().manual_seed(t))
            for k, v in model.named_parameters()
        }
        updates = ClientUpdates(
            t,
            torch.tensor([0, 3]),
            deltas,
            torch.tensor([30, 30]),
            torch.ones(2),
            model,
            {"global_loss": torch.tensor([0.5, 1.5])},
        )
        state, _ = afl.aggregate(state, updates)
        models.append(afl.server_params(state))
    assert afl.evaluates == "average" and state["base"]["num_averaged"] == 2
    for k, v in state["base"]["average"].items():
        assert torch.equal(v, (1 * models[0][k] + models[1][k]) / 2), k


class _DeclaredPrivate(FedAvg):
    name = "declared-private"
    needs = Needs(sums_only=True, private=True)


class _DeclaredPersonal(FedAvg):
    name = "declared-personal"
    needs = Needs(personal=True)


def test_capabilities_are_read_from_needs_not_from_names_or_attributes():
    """``private``, ``weighted_direction`` and ``personal`` are declared in ``Needs``; composition reads them."""
    val = (torch.zeros(4, 1, 8, 8), torch.arange(4) % 2)
    assert DPFedAvg().needs.private and not FedAvg().needs.private
    assert SCAFFOLD().needs.weighted_direction and FedDyn().needs.weighted_direction
    assert not FedAvg().needs.weighted_direction
    assert all(s.needs.personal for s in (Ditto(), LocalOnly(), Gossip(num_neighbours=2), NoOp(Ditto())))
    assert not FedVG(val).needs.personal and not NoOp(FedAvg()).needs.personal
    with pytest.raises(ValueError, match="FedVG over declared-private cannot work: FedVG re-weights"):
        FedVG(val, base=_DeclaredPrivate())
    assert Ditto(base=_DeclaredPrivate()).needs.private  # Ditto does not re-weight: its server step is the base's
    for outer in (lambda b: FedVG(val, base=b), lambda b: Ditto(base=b)):
        with pytest.raises(ValueError, match="declared-personal is already personalised"):
            outer(_DeclaredPersonal())
    assert not hasattr(Strategy, "model_key") and not hasattr(DPFedAvg, "private")


def test_a_wrapper_declares_what_it_wraps_and_an_undeclared_override_is_refused_at_definition():
    """Was: Wrapper decided its server step (and dropped sums_only/private) by checking which methods a
    subclass overrides. Now the class says so (``wraps``), and the check runs when the class is defined."""
    from fedlearn_edu.strategies.wrapper import WRAPPER_PARTS

    assert Wrapper.wraps == frozenset() and NoOp.wraps == frozenset() and Halved.wraps == {"server"}
    assert Ditto.wraps == {"state", "client", "evaluation"} and FedVG.wraps == {"client", "server"}
    assert set(WRAPPER_PARTS) == {"state", "client", "server", "evaluation"}
    with pytest.raises(TypeError, match=r"^Undeclared overrides direction\(\), a hook of the round's 'server' part"):

        class Undeclared(Wrapper):
            def direction(self, server_state, updates):
                return super().direction(server_state, updates)

    with pytest.raises(TypeError, match=r"add  wraps = \{'client', 'server'\}  to its class body"):

        class HalfDeclared(Wrapper):
            wraps = {"server"}

            def client_update(self, work, server_state, state):
                return super().client_update(work, server_state, state)

    with pytest.raises(TypeError, match=r"wraps names 'servers', not a part of the round"):

        class Typo(Wrapper):
            wraps = {"servers"}

    # the declaration, not the overrides, decides: declared "server" with no override of its own is
    # the base's direction + step (not its aggregate), and it drops the base's sums_only
    class DeclaredOnly(Wrapper):
        wraps = "server"

    assert DeclaredOnly.wraps == {"server"} and not DeclaredOnly(FedAvg()).needs.sums_only
    assert NoOp(FedAvg()).needs.sums_only

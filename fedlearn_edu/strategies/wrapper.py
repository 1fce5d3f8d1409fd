"""Strategies built on another strategy: :class:`Wrapper` forwards every hook to its base.

A method that changes one part of a round and keeps the rest of any other method -- FedVG
changes the server's weighting of the updates (its :meth:`~Strategy.direction`), Ditto adds a
personal step to the clients' update and evaluates the personal models -- subclasses
:class:`Wrapper`, declares which parts of its base's round it wraps (``wraps``, from
:data:`WRAPPER_PARTS`: ``"state"``, ``"client"``, ``"server"``, ``"evaluation"``) and overrides
only hooks of those parts::

    class Halved(Wrapper):                      # half of the base's server step, over any base
        wraps = {"server"}

        def direction(self, server_state, updates):
            g, server_state, diag = super().direction(server_state, updates)
            return {k: v / 2 for k, v in g.items()}, server_state, diag

    Halved(SCAFFOLD())                          # SCAFFOLD's clients, control variates and optimizer

Everything else is the base's, on the base's state: the server state is a
:class:`~fedlearn_edu.strategies.state.WrapperState` whose ``base`` is the base's server state
(a wrapper that keeps entries of its own declares a subclass with them), the client state is
the base's (a wrapper may add rows of its own), and the server's model is where the base keeps
it (:meth:`Wrapper.server_params` asks the base, recursively through nested wrappers). The
server step is the base's own ``aggregate`` unless the wrapper declares ``"server"`` (or has an
optimizer of its own); then it is :meth:`~Strategy.direction` (the base's, unless overridden),
then :meth:`~Strategy.apply`, whose :meth:`~Strategy.step` is the base's with the wrapper's
optimizer -- so what a base keeps after its step (AFL's averaged iterate) is kept under any
wrapper. A wrapper that declares ``"server"`` may read each update, so it does not inherit its
base's ``sums_only`` (secure aggregation) or ``private`` (DP-FedAvg) declarations.

The declaration is checked when the class is defined: a hook overridden outside the declared
parts is refused there, with the line to add, so behaviour never depends on which methods a
subclass happens to override.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from torch import Tensor, nn

from ..engine import LocalResult, LocalTraining
from ..params import Params
from .base import ClientOutput, ClientUpdates, ClientWork, Needs, Strategy
from .server_optim import ServerOptimizer
from .state import WrapperState, updated

__all__ = ["Wrapper", "WRAPPER_PARTS"]

# The parts of a round a wrapper may change, and the hooks of each. A Wrapper subclass declares
# the parts it changes (``wraps``); it may override only those parts' hooks.
WRAPPER_PARTS: dict[str, tuple[str, ...]] = {
    "state": ("init_state", "init_optimizer_state", "server_params", "with_server_params", "client_view"),
    "client": ("configure_local", "client_signals", "client_update"),
    "server": ("direction", "apply", "step", "aggregate", "nonfinite_hint"),
    "evaluation": ("eval_models",),
}


class Wrapper(Strategy):
    """A strategy on top of a base strategy: every hook is the base's, on the base's nested state.

    Args:
        base: the base :class:`Strategy` (``None``: the wrapper stands alone on the protocol's
            defaults -- FedAvg's clients, a flat server state ``{"params", "optimizer", ...}`` --
            as ``FedVG(val)`` does).
        optimizer: the optimizer of the server step (default: the base's). A different one keeps
            its state where the base keeps its optimizer's (:meth:`Strategy.init_optimizer_state`).

    Class attribute:

    - ``wraps``: the parts of the base's round the subclass changes, a subset of
      :data:`WRAPPER_PARTS` (``"state"``, ``"client"``, ``"server"``, ``"evaluation"``); empty by
      default (every hook is the base's). ``"server"`` makes the server step the wrapper's own
      (:meth:`direction`, then :meth:`apply`) and drops the base's ``sums_only`` and ``private``.
      A subclass that overrides a hook of an undeclared part is refused when it is defined.

    Raises:
        TypeError: ``base`` is not a :class:`Strategy`, or ``optimizer`` not a
            :class:`~fedlearn_edu.strategies.server_optim.ServerOptimizer`.

    Example:
        >>> from fedlearn_edu import Ditto, FedAvg
        >>> w = Wrapper(Ditto(0.5))
        >>> w.needs.personal, w.evaluates, w.optimizer is w.base.optimizer
        (True, 'personal', True)
    """

    wraps: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs):
        """Check the subclass's ``wraps`` against the hooks it overrides (at class definition)."""
        super().__init_subclass__(**kwargs)
        wraps = cls.__dict__.get("wraps", cls.wraps)
        wraps = (wraps,) if isinstance(wraps, str) else wraps
        try:
            wraps = frozenset(wraps)
        except TypeError:
            raise TypeError(
                f"{cls.__name__}.wraps must be a set of parts of the round, e.g. {{'server'}}, got {wraps!r}."
            ) from None
        unknown = sorted(str(p) for p in wraps - set(WRAPPER_PARTS))
        if unknown:
            raise TypeError(
                f"{cls.__name__}.wraps names {unknown[0]!r}, not a part of the round; the parts are "
                f"{list(WRAPPER_PARTS)}."
            )
        cls.wraps = wraps
        for part, hooks in WRAPPER_PARTS.items():
            for hook in hooks:
                if hook in cls.__dict__ and part not in wraps:
                    declared = sorted(wraps | {part})
                    raise TypeError(
                        f"{cls.__name__} overrides {hook}(), a hook of the round's {part!r} part, but does not "
                        f"declare that it wraps it: add  wraps = {{{', '.join(map(repr, declared))}}}  to its class "
                        "body (a Wrapper declares the parts of its base's round it changes)."
                    )

    def __init__(self, base: Strategy | None, optimizer: ServerOptimizer | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        if base is not None and not isinstance(base, Strategy):
            raise TypeError(
                f"{type(self).__name__}'s base must be a fedlearn_edu Strategy (e.g. FedAvg()), got "
                f"{type(base).__name__}."
            )
        if optimizer is None and base is not None:
            optimizer = base.optimizer
        super().__init__(optimizer=optimizer)
        self.base = base

    # ------------------------------------------------------- the base and its state
    @property
    def _inner(self):
        """The strategy the hooks forward to: ``base``, or the protocol's defaults (no base)."""
        return super() if self.base is None else self.base

    def base_state(self, server_state: Mapping) -> Mapping:
        """The base's server state inside the wrapper's.

        Args:
            server_state: the wrapper's server state (or its :meth:`client_view`).

        Returns:
            ``server_state["base"]`` (the whole state without a base).
        """
        return server_state if self.base is None else server_state["base"]

    def with_base_state(self, server_state: Mapping, base_state: dict) -> Mapping:
        """The wrapper's server state with the base's replaced (the inverse of :meth:`base_state`).

        Args:
            server_state: the wrapper's server state (not modified).
            base_state: the base's new server state.

        Returns:
            ``updated(server_state, base=base_state)`` (``base_state`` itself without a base).
        """
        return base_state if self.base is None else updated(server_state, base=base_state)

    # ------------------------------------------------------ declarations of the base
    @property
    def needs(self) -> Needs:
        """The base's :class:`~fedlearn_edu.strategies.base.Needs`, less what a new server step voids.

        A subclass that wraps the ``"server"`` part may read each update and re-weight them, so the
        base's ``sums_only`` (secure aggregation) and ``private`` (DP-FedAvg's sensitivity bound) no
        longer hold for it: they are ``False`` unless the subclass declares its own ``needs``.
        """
        needs = self._inner.needs
        if self.base is not None and "server" in self.wraps:
            needs = replace(needs, sums_only=False, private=False)
        return needs

    @property
    def evaluates(self) -> str:
        """Which model ``History.client_accuracy`` is of: the base's."""
        return self._inner.evaluates

    @property
    def diagnostics(self) -> tuple[str, ...]:
        """The optional diagnostics the base needs recorded."""
        return self._inner.diagnostics

    @property
    def prox_argument(self) -> str:
        """The base's argument that sets the clients' ``prox_mu``, as ``"base.<name>"`` (``""``: none)."""
        argument = self._inner.prox_argument
        return f"base.{argument}" if argument and self.base is not None else argument

    @property
    def validation_data(self) -> tuple[Tensor, Tensor]:
        """The base's server validation set (when ``needs.validation``)."""
        return self._inner.validation_data

    def nonfinite_hint(self) -> str:
        """The base's advice for a NaN/Inf direction."""
        return self._inner.nonfinite_hint()

    def min_clients_per_round(self) -> int:
        """The base's fewest clients per round (1 without a base).

        Returns:
            The smallest m.
        """
        return 1 if self.base is None else self.base.min_clients_per_round()

    # ----------------------------------------------------------------------- state
    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """``WrapperState(base=the base's server state)`` and the base's client state.

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device.
            model: the architecture (passed to the base).
            num_clients: N (passed to the base).
            seed: the run's seed (passed to the base).

        Returns:
            ``(server_state, client_state)``; with an optimizer of the wrapper's own, the base's
            optimizer state is that optimizer's.
        """
        base, clients = self._inner.init_state(params, model, num_clients, seed)
        if self.base is not None and self.optimizer is not self.base.optimizer:
            base = self.base.init_optimizer_state(base, self.optimizer)
        return (base if self.base is None else WrapperState(base=base)), clients

    def init_optimizer_state(self, server_state: Mapping, optimizer: ServerOptimizer) -> Mapping:
        """The base's :meth:`~Strategy.init_optimizer_state`, on the base's state.

        Args:
            server_state: the wrapper's server state (not modified).
            optimizer: the optimizer that will step the server's model.

        Returns:
            A new server state.
        """
        return self.with_base_state(
            server_state, self._inner.init_optimizer_state(self.base_state(server_state), optimizer)
        )

    def server_params(self, server_state: Mapping) -> Params | None:
        """The base's model(s), in the base's state.

        Args:
            server_state: the wrapper's server state (or its :meth:`client_view`).

        Returns:
            ``base.server_params(server_state["base"])``.
        """
        return self._inner.server_params(self.base_state(server_state))

    def with_server_params(self, server_state: Mapping, params: Params) -> Mapping:
        """The server state with the base's model(s) replaced.

        Args:
            server_state: the wrapper's server state (not modified).
            params: the new model(s).

        Returns:
            A new server state.
        """
        return self.with_base_state(server_state, self._inner.with_server_params(self.base_state(server_state), params))

    def client_view(self, server_state: Mapping) -> dict:
        """``{"base": what the base's clients read}``.

        Args:
            server_state: the wrapper's server state.

        Returns:
            ``{"base": base.client_view(server_state["base"])}``.
        """
        return self.with_base_state({}, self._inner.client_view(self.base_state(server_state)))

    # ----------------------------------------------------------------- client side
    def configure_local(self, config: LocalTraining) -> LocalTraining:
        """The base's client settings.

        Args:
            config: the run's settings for the round.

        Returns:
            ``base.configure_local(config)``.
        """
        return self._inner.configure_local(config)

    def client_signals(self, model: nn.Module, global_params: Params, local: LocalResult, datasets) -> dict:
        """The base's client signals.

        Args:
            model: the architecture.
            global_params: theta_t ``{name: Tensor}``.
            local: the clients' local training.
            datasets: the clients' training sets.

        Returns:
            ``{name: Tensor[m, ...]}``.
        """
        return self._inner.client_signals(model, global_params, local, datasets)

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """The base's client update, on the base's state.

        Args:
            work: the round's clients.
            server_state: the wrapper's server state, or its :meth:`client_view`.
            state: the selected clients' rows of the client state ``{name: Tensor[m, ...]}``.

        Returns:
            The base's :class:`ClientOutput`.
        """
        return self._inner.client_update(work, self.base_state(server_state), state)

    # ----------------------------------------------------------------- server side
    def direction(
        self, server_state: Mapping, updates: ClientUpdates, weights: Tensor | None = None
    ) -> tuple[Params, Mapping, dict]:
        """The base's direction, on the base's state.

        Args:
            server_state: the wrapper's server state (not modified).
            updates: the round's updates (not modified).
            weights: ``Tensor[m]`` passed on to a base whose direction takes them
                (``needs.weighted_direction``); ``None``: the base's own weighting.

        Returns:
            ``(g, server_state with the base's new state, the base's diagnostics)``.
        """
        extra = {} if weights is None else {"weights": weights}
        g, base, diag = self._inner.direction(self.base_state(server_state), updates, **extra)
        return g, self.with_base_state(server_state, base), diag

    def step(self, server_state: Mapping, g: Params, optimizer: ServerOptimizer | None = None) -> Mapping:
        """The base's step along ``g`` with the wrapper's optimizer, on the base's state.

        Args:
            server_state: the wrapper's server state (not modified).
            g: the direction, shaped like :meth:`server_params`.
            optimizer: the optimizer that steps (default: the wrapper's; an outer wrapper passes its own).

        Returns:
            The server state with the base's new state.
        """
        optimizer = self.optimizer if optimizer is None else optimizer
        return self.with_base_state(server_state, self._inner.step(self.base_state(server_state), g, optimizer))

    def aggregate(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Mapping, dict]:
        """The base's server step (:meth:`direction`, :meth:`apply`) on the base's state; pure.

        A wrapper that does not wrap the ``"server"`` part (and steps with its base's optimizer)
        runs the base's own ``aggregate`` (whatever the base does there); otherwise
        :meth:`direction`, then :meth:`apply`.

        Args:
            server_state: the wrapper's server state at round t (not modified).
            updates: the round's updates (not modified).

        Returns:
            ``(server_state at t + 1, diagnostics)``.
        """
        own_step = "server" in self.wraps or (self.base is not None and self.optimizer is not self.base.optimizer)
        if self.base is not None and not own_step:
            base, diag = self.base.aggregate(self.base_state(server_state), updates)
            return self.with_base_state(server_state, base), diag
        return super().aggregate(server_state, updates)

    # ------------------------------------------------------------------ evaluation
    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """The base's models to evaluate, on the base's state.

        Args:
            model: the architecture.
            server_state: the wrapper's server state (on a Flower node: its :meth:`client_view`).
            state: the client state ``{name: Tensor[N, ...]}``.
            train_sets: the clients' training sets.

        Returns:
            ``base.eval_models(model, server_state["base"], state, train_sets)``.
        """
        return self._inner.eval_models(model, self.base_state(server_state), state, train_sets)

    def __repr__(self) -> str:
        """``Name(hyper-parameter=value, ..., base=...)``: the base last."""
        args = [f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k != "base"]
        return f"{type(self).__name__}({', '.join([*args, f'base={self.base!r}'])})"

"""Typed server states: one frozen dataclass per kind of strategy, its fields the state's entries.

A strategy's server state (what :meth:`~fedlearn_edu.strategies.base.Strategy.init_state`
returns and :meth:`~fedlearn_edu.strategies.base.Strategy.aggregate` passes on) is a
:class:`ServerState`: a frozen dataclass whose fields say what the server keeps between rounds
and of which type -- the model (:class:`ModelState`'s ``params``), the optimizer's moments
(``optimizer``), the method's own tensors (:class:`CRAFTState`'s ``reference``, SCAFFOLD's
``control``, ...) and, for a strategy built on another one, the base's state
(:class:`WrapperState`'s ``base``). A new state is made with :func:`updated` (or
``state.replace(...)``); a name the state does not declare is an error, not a new key::

    state = CRAFTState(params=theta0, optimizer={}, reference=None)
    state = updated(state, reference=g)       # a new CRAFTState; `state.reference` is g
    updated(state, referense=g)               # TypeError: CRAFTState has no field 'referense'

A state reads like the dict it stands for (``state["params"]``, ``dict(state)``, ``**state``),
so the strategies' hooks read a state and the part of it the clients receive
(:meth:`~fedlearn_edu.strategies.base.Strategy.client_view`, a plain dict that travels to Flower
nodes) alike. A checkpoint stores a state as the nested dict of its fields (the layout of the files
written before the states were typed) and :func:`load_state` rebuilds the typed state from it
on the run's template (its ``init_state``).

A strategy written outside the package may keep a plain dict as its server state: every
function here and every hook of the base classes accepts one.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ..params import Params

__all__ = [
    "ServerState",
    "ModelState",
    "ClusterState",
    "PeerState",
    "WrapperState",
    "CRAFTState",
    "SCAFFOLDState",
    "FedDynState",
    "AFLState",
    "DPState",
    "AdaptiveDPState",
    "CenteredClippingState",
    "GossipState",
    "DACState",
    "updated",
    "load_state",
]


_METHODS = frozenset({"get", "items", "keys", "values", "replace"})


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class ServerState(Mapping):
    """Base of the typed server states: a frozen dataclass read like a dict of its fields.

    With no fields of its own it is the empty state (local-only training keeps nothing on the
    server). Subclasses declare the entries as dataclass fields.

    Example:
        >>> s = ModelState(params={}, optimizer={})
        >>> list(s), s["optimizer"], type(s.replace(optimizer={"m": 0})).__name__
        (['params', 'optimizer'], {}, 'ModelState')
    """

    def __init_subclass__(cls, **kwargs):
        """Refuse a field that would hide one of the methods a state is read with."""
        super().__init_subclass__(**kwargs)
        clash = sorted(_METHODS & set(inspect.get_annotations(cls)))
        if clash:
            raise TypeError(
                f"{cls.__name__} may not declare a field named {clash[0]!r}: a ServerState reads like a dict, "
                f"and {clash[0]}() is one of its methods ({', '.join(sorted(_METHODS))}). Name the field otherwise."
            )

    def __getitem__(self, key: str):
        """The field ``key`` (``KeyError`` for a name the state does not declare)."""
        if not isinstance(key, str) or key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        """The field names, in declaration order."""
        return iter(self._names())

    def __len__(self) -> int:
        """The number of fields."""
        return len(self._names())

    def __repr__(self) -> str:
        """The class and its field names (the tensors are not printed)."""
        return f"{type(self).__name__}({', '.join(self._names())})"

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **entries) -> ServerState:
        """A new state of the same type with ``entries`` in place of the fields of those names.

        Args:
            **entries: the new values, by field name.

        Returns:
            The new state (this one is not modified).

        Raises:
            TypeError: a name that is not one of the state's fields (the message lists them).
        """
        unknown = sorted(set(entries) - set(self._names()))
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no field {unknown[0]!r}; its fields are {list(self._names())}. "
                "A strategy that keeps more declares a ServerState subclass with those fields "
                "(fedlearn_edu.strategies.state)."
            )
        return dataclasses.replace(self, **entries)


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class ModelState(ServerState):
    """One global model and its server optimizer's state (FedAvg and every one-model method).

    Attributes:
        params: theta_t, ``{name: Tensor[...]}``.
        optimizer: the server optimizer's state (``{}`` for SGD; ``{"m", "v"}`` for Adam, ...).
    """

    params: Params
    optimizer: dict


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class ClusterState(ServerState):
    """IFCA's K cluster models and their optimizer's state.

    Attributes:
        clusters: ``{name: Tensor[K, ...]}``.
        optimizer: the server optimizer's state (over the stacked models).
    """

    clusters: Params
    optimizer: dict


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class PeerState(ServerState):
    """Decentralised training: the N clients' models, stepped by the mixing.

    Attributes:
        models: ``{name: Tensor[N, ...]}``.
        optimizer: the optimizer's state (over the stacked models).
    """

    models: Params
    optimizer: dict


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class WrapperState(ServerState):
    """A strategy built on a base strategy (:class:`~fedlearn_edu.strategies.wrapper.Wrapper`).

    Attributes:
        base: the base strategy's server state.
    """

    base: Mapping


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class CRAFTState(ModelState):
    """CRAFT: the model, the optimizer and the previous direction.

    Attributes:
        reference: the previous round's direction ``{name: Tensor}``, ``None`` before round 1.
    """

    reference: Params | None


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class SCAFFOLDState(ModelState):
    """SCAFFOLD: the model, the optimizer and the server's control variate.

    Attributes:
        control: c, ``{name: Tensor}`` shaped like the model.
        num_clients: N (the control variate's update is scaled by m / N).
    """

    control: Params
    num_clients: int


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class FedDynState(ModelState):
    """FedDyn: the model, the optimizer and the server's state h.

    Attributes:
        h: ``{name: Tensor}`` shaped like the model.
        num_clients: N.
    """

    h: Params
    num_clients: int


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class AFLState(ModelState):
    """AFL: the model, the optimizer, the mixture weights and the averaged iterate.

    Attributes:
        lambdas: ``Tensor[N]`` (float64, on the CPU), the mixture weights over the clients.
        average: the averaged iterate ``{name: Tensor}`` (``None`` before the first step).
        num_averaged: how many iterates ``average`` holds.
    """

    lambdas: Tensor
    average: Params | None
    num_averaged: int


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class DPState(ModelState):
    """DP-FedAvg with a fixed clip: the model, the optimizer and the noise seed.

    Attributes:
        noise_seed: the run's seed, from which each round's noise is drawn.
    """

    noise_seed: int


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class AdaptiveDPState(DPState):
    """DP-FedAvg with adaptive clipping: :class:`DPState` and the round's clipping norm.

    Attributes:
        clip: C_t (a Python float; C_0 is the strategy's ``clip``).
    """

    clip: float


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class CenteredClippingState(ModelState):
    """Centered clipping: the model, the optimizer and the last aggregate (the next centre).

    Attributes:
        center: ``{name: Tensor}`` shaped like the model.
    """

    center: Params


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class GossipState(PeerState):
    """Gossip: the models, the optimizer and the fixed mixing matrix.

    Attributes:
        mixing: ``Tensor[N, N]``, or ``None`` when the neighbours are sampled each round.
    """

    mixing: Tensor | None


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class DACState(PeerState):
    """DAC: the models, the optimizer and the clients' scores of each other.

    Attributes:
        similarity: ``Tensor[N, N]`` (float64), the last score of client j by client i.
        contacted: ``Tensor[N, N]`` (bool), whether i has scored j.
    """

    similarity: Tensor
    contacted: Tensor


def updated(state: Mapping, **entries) -> Mapping:
    """``state`` with ``entries`` replaced: a new state of the same type (the caller's is kept).

    Args:
        state: a :class:`ServerState`, or a plain dict (a client view, a user's strategy).
        **entries: the new values.

    Returns:
        ``state.replace(**entries)`` for a typed state; ``{**state, **entries}`` for a dict.

    Raises:
        TypeError: a typed state without a field of one of the names.
    """
    if isinstance(state, ServerState):
        return state.replace(**entries)
    return {**state, **entries}


def load_state(template: Any, saved: Any) -> Any:
    """``saved`` (a state as the nested dict of its fields) rebuilt with the types of ``template``.

    Args:
        template: the run's state of the same strategy (e.g. its ``init_state``): where it holds
            a :class:`ServerState`, the result holds one of the same class.
        saved: the stored nested dict (its values are taken as they are).

    Returns:
        ``saved`` with typed states where ``template`` has them.

    Raises:
        KeyError: ``saved`` lacks a field of a typed state (the checkpoint checks this first,
            :func:`~fedlearn_edu.checkpoint.check_states`).
    """
    if isinstance(template, ServerState):
        return type(template)(**{k: load_state(template[k], saved[k]) for k in template})
    if isinstance(template, Mapping) and isinstance(saved, Mapping):
        return {k: load_state(template.get(k), v) for k, v in saved.items()}
    return saved

"""The strategy registry: every method by its short name, for :func:`make_strategy`, the CLI and the benchmark.

A strategy class registers itself with one line, the :func:`register` decorator, wherever it
is defined (a module of the package or the user's own)::

    from fedlearn_edu.strategies import FedAvg, register

    @register
    class Mine(FedAvg):
        name = "mine"

Then ``make_strategy("mine")``, ``benchmark.Method("mine")`` and
``python -m fedlearn_edu run --plugin mymodule --strategy mine`` build it. Only decorated
classes are registered: a subclass written for a test or inside a chapter stays out of the
registry unless it asks.
"""

from __future__ import annotations

import inspect
import re
from types import MappingProxyType

from .base import Needs, Strategy

__all__ = ["STRATEGIES", "register", "strategy_class", "strategy_parameters", "make_strategy", "Builder"]

_REGISTRY: dict[str, type] = {}
STRATEGIES = MappingProxyType(_REGISTRY)  # {name: class}, read-only; register() adds to it
_NAME = re.compile(r"[a-z][a-z0-9]*")
_SERVER_STEP = ("server_lr", "optimizer")  # what a strategy without a server model does not take


def _normalise(name: str) -> str:
    """The registry key of ``name``: lowercase, ``-`` and ``_`` dropped (``"Fed-Avg_M"`` -> ``"fedavgm"``)."""
    return name.lower().replace("-", "").replace("_", "")


def register(cls: type) -> type:
    """Register a strategy class under its ``name`` (a class decorator); returns the class unchanged.

    Registering the same class again (a re-imported module, a notebook cell run twice: the
    same module and qualified name) replaces the entry.

    Args:
        cls: a subclass of :class:`~fedlearn_edu.strategies.Strategy` whose own class body sets
            ``name``: lowercase letters and digits, starting with a letter (``"fedavg"``).

    Returns:
        ``cls``.

    Raises:
        TypeError: ``cls`` is not a Strategy subclass, or does not set its own ``name``.
        ValueError: the name is not in its normal form (``make_strategy`` ignores case, ``-`` and
            ``_``), or another class is registered under it.
    """
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"register takes a Strategy subclass (use @register above the class), got {cls!r}.")
    name = cls.__dict__.get("name")
    if not isinstance(name, str):
        raise TypeError(
            f"register: {cls.__qualname__} must set its own short name in its class body "
            f'(e.g. name = "{_normalise(cls.__name__)}"), got {name!r}.'
        )
    if not _NAME.fullmatch(name):
        fix = _normalise(name)
        hint = f"use {fix!r}" if _NAME.fullmatch(fix) else "use lowercase letters and digits, starting with a letter"
        raise ValueError(
            f"register: {cls.__qualname__}'s name {name!r} is not a registry name (make_strategy ignores case, "
            f"'-' and '_', so names are lowercase letters and digits); {hint}."
        )
    old = _REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(
            f"register: the name {name!r} of {cls.__module__}.{cls.__qualname__} is taken by "
            f"{old.__module__}.{old.__qualname__}; give the new class another name."
        )
    _REGISTRY[name] = cls
    return cls


def strategy_class(name: str) -> type:
    """The registered class of a short name.

    Args:
        name: ``"fedavg"``, ``"craft"``, ``"ditto"``, ... (case, ``-`` and ``_`` ignored).

    Returns:
        The :class:`Strategy` subclass.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: an unknown name.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"name must be a strategy's short name (a str, e.g. 'fedavg'), got {name!r} ({type(name).__name__}); "
            f"choose one of {sorted(STRATEGIES)}."
        )
    key = _normalise(name)
    if key not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}.")
    return STRATEGIES[key]


def _no_server_model(cls: type) -> bool:
    """``cls`` declares no server model (``needs.server_model == "none"``): it has no server step."""
    return isinstance(cls.needs, Needs) and cls.needs.server_model == "none"


def _arguments(cls: type) -> dict[str, bool]:
    """``{argument: required}`` of ``cls``'s constructor; no server step's for a strategy without one."""
    skip = _SERVER_STEP if _no_server_model(cls) else ()
    return {
        p.name: p.default is p.empty
        for p in inspect.signature(cls).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip
    }


def _parameters(cls: type) -> list[str] | None:
    """The keyword arguments :func:`make_strategy` gives ``cls`` (``None``: any, ``**kwargs``)."""
    if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values()):
        return None
    return list(_arguments(cls))


def _takes_base(cls: type) -> bool:
    """``cls`` is built on a base strategy: its constructor takes ``base`` (or any keyword)."""
    own = _parameters(cls)
    return own is None or "base" in own


def strategy_parameters(name: str) -> dict[str, bool]:
    """What :func:`make_strategy` accepts for ``name`` without a ``base``: ``{argument: required}``.

    The strategy's constructor arguments (``base`` left out; ``server_lr`` and ``optimizer`` too
    for a strategy that keeps no server model, ``needs.server_model == "none"``: it has no
    server step) and, for a strategy built on a base strategy by default (``default_base``,
    e.g. Ditto's FedAvg), the base's.

    Args:
        name: a registered short name.

    Returns:
        ``{argument: True when it has no default}``, the strategy's own first.
    """
    out: dict[str, bool] = {}
    cls = strategy_class(name)
    chain = [cls] + ([strategy_class(cls.default_base)] if cls.default_base else [])
    for c in chain:
        for param, required in _arguments(c).items():
            if param != "base":
                out.setdefault(param, required)
    return out


def make_strategy(name: str, base=None, **kwargs) -> Strategy:
    """Build a strategy from its short name, and a strategy built on a base strategy (Ditto, FedVG).

    Args:
        name: ``"fedavg"``, ``"craft"``, ``"ditto"``, ``"ifca"``, ``"local"``, ... (case, ``-`` and
            ``_`` ignored); any name in :data:`STRATEGIES`, the user's registered ones included.
        base: for a strategy built on a base (its constructor takes ``base``): the base, a
            :class:`Strategy` or a short name (``None``: the strategy's ``default_base``, e.g.
            FedAvg for Ditto, none for FedVG). With a name, the keyword arguments the base's
            constructor takes go to the base and the others to the strategy:
            ``make_strategy("ditto", base="fedprox", mu=0.1, lam=1.0)`` is
            ``Ditto(lam=1.0, base=FedProx(mu=0.1))``.
        **kwargs: the constructor arguments.

    Returns:
        The :class:`Strategy`.

    Raises:
        TypeError: ``name`` is not a string; ``base`` for a strategy that takes none; an argument
            that neither the strategy nor its base takes (``server_lr`` or ``optimizer`` for a
            strategy without a server model).
        ValueError: an unknown name (of the strategy or its base).

    Example:
        >>> make_strategy("ditto", base="craft", lam=0.5).name
        'ditto+craft'
    """
    cls = strategy_class(name)
    own = _parameters(cls)
    takes_base = _takes_base(cls)
    if base is not None and not takes_base:
        raise TypeError(
            f"{cls.name} takes no base strategy (got base={base!r}); drop base=, or choose a strategy built on "
            f"one: {sorted(n for n, c in STRATEGIES.items() if _takes_base(c))}."
        )
    if takes_base:
        base = cls.default_base if base is None else base
        if isinstance(base, str):
            taken = _parameters(strategy_class(base))
            to_base = {k: v for k, v in kwargs.items() if taken is None or k in taken}
            kwargs = {k: v for k, v in kwargs.items() if k not in to_base}
            base = make_strategy(base, **to_base)
        if base is not None:
            kwargs["base"] = base
    unknown = sorted(set(kwargs) - set(own)) if own is not None else []
    if unknown:
        why = " (it keeps no server model: no server step)" if unknown[0] in _SERVER_STEP else ""
        raise TypeError(
            f"{cls.name} takes no argument {unknown[0]!r}{why}; its arguments: {[p for p in own if p != 'base']}"
            + (f", and its base's (base={base.name!r})." if takes_base and base is not None else ".")
        )
    return cls(**kwargs)


class Builder:
    """``make_strategy(name, **settings)`` as a picklable object that carries the registered class.

    A worker process (the benchmark's ``"joblib"`` and ``"dask"`` backends) starts with the
    package's strategies only. Unpickling the class there imports the user's module, which
    registers it; a class pickled by value (defined in a notebook or ``__main__``) is registered
    on the first call.

    Args:
        name: a registered short name.

    Example:
        >>> import pickle
        >>> pickle.loads(pickle.dumps(Builder("fedprox")))(mu=0.1).mu
        0.1
    """

    def __init__(self, name: str):
        self.cls = strategy_class(name)
        self.name = self.cls.name

    def __call__(self, **settings) -> Strategy:
        """``make_strategy(name, **settings)``, after registering the class where it is missing."""
        if self.name not in _REGISTRY:
            register(self.cls)
        return make_strategy(self.name, **settings)

    def __repr__(self) -> str:
        return f"Builder({self.name!r})"

"""The grid's methods: :class:`Method`, the package's :data:`METHODS` and the committed grids' lists."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product

from ..checks import check_instance, check_name, check_positive, check_range


@dataclass(frozen=True)
class Method:
    """One method of the grid: how to build its strategy and what to tune.

    Args:
        name: the label in the records and tables (e.g. ``"fedprox"``).
        strategy: a name of :data:`fedlearn_edu.strategies.STRATEGIES` (the user's registered
            strategies included; built by :func:`~fedlearn_edu.strategies.make_strategy` with the
            settings), or ``"conditional"``; used when ``factory`` is ``None``.
        fixed: settings passed to the strategy as they are.
        tune: ``{setting: [candidates]}``; the tuning step tries the full product.
        factory: for a method outside the package: a module-level function
            ``factory(**settings) -> Strategy`` (picklable, so that worker processes can call it).
        server_validation: FedVG's share of every client's training data pooled as the
            server's validation set (taken *before* label noise: a clean, curated set).
        note: what the method's accuracy is of, when it is not the global model's.
        extend: the tuned settings the protocol's edge rule may extend past the grid's ends
            (``None``: those of ``tune`` that are scales: the steps ``server_lr`` and
            ``effective_lr`` and the knobs ``mu``, ``alpha``, ``q``, ``lambda_lr``, ``lam``;
            never a bounded one such as ``momentum`` or a count such as ``num_clusters``).

    Raises:
        TypeError: a field of the wrong type (``name`` or ``strategy`` not a string, ``fixed``/``tune``
            not mappings, a candidate list not a list, ``factory`` not callable).
        ValueError: an empty name or candidate list, ``server_validation`` outside ``[0, 1)``, or
            ``extend`` naming a setting that is not tuned or has non-positive candidates. A
            strategy name or setting the strategy refuses is found by :func:`run` before its
            first run.
    """

    name: str
    strategy: str | None = None
    fixed: Mapping = field(default_factory=dict)
    tune: Mapping = field(default_factory=dict)
    factory: Callable | None = None
    server_validation: float = 0.0
    note: str = ""
    extend: tuple | None = None

    def __post_init__(self):
        check_name(self.name, "Method name", "fedavg")
        if self.factory is None and self.strategy is None:
            object.__setattr__(self, "strategy", self.name)
        if self.factory is not None:
            check_instance(self.factory, "Method factory", Callable, "a callable (factory(**settings) -> Strategy)")
        if self.strategy is not None:
            check_instance(self.strategy, f"Method {self.name!r}: strategy", str, "a strategy's name")
        for what in ("fixed", "tune"):
            check_instance(getattr(self, what), f"Method {self.name!r}: {what}", Mapping, "a mapping {setting: ...}")
        check_range(self.server_validation, "server_validation", 0.0, 1.0, high_open=True)
        check_instance(self.note, f"Method {self.name!r}: note", str, "a string")
        for key, values in dict(self.tune).items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise TypeError(f"Method {self.name!r}: tune[{key!r}] must be a list of candidates, got {values!r}.")
            if len(values) == 0:
                raise ValueError(f"Method {self.name!r}: tune[{key!r}] must be a non-empty list, got {values!r}.")
        object.__setattr__(self, "fixed", dict(self.fixed))
        object.__setattr__(self, "tune", {k: list(v) for k, v in dict(self.tune).items()})
        extend = tuple(k for k in self.tune if k in SCALE_SETTINGS) if self.extend is None else self.extend
        if isinstance(extend, str) or not isinstance(extend, Sequence) or not all(isinstance(k, str) for k in extend):
            raise TypeError(f"Method {self.name!r}: extend must be a tuple of setting names, got {self.extend!r}.")
        for key in extend:
            values = self.tune.get(key)
            if values is None:
                raise ValueError(f"Method {self.name!r}: extend names {key!r}, which is not tuned.")
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf for v in values):
                raise ValueError(
                    f"Method {self.name!r}: the edge rule extends positive numbers; tune[{key!r}] = {values!r}."
                )
        object.__setattr__(self, "extend", tuple(extend))

    def candidates(self, grid: Mapping | None = None) -> list[dict]:
        """Every candidate setting (fixed + one value per tuned setting), in the grid's order.

        Args:
            grid: ``{setting: values}`` to enumerate instead of :attr:`tune` (the edge rule's
                extended grid).
        """
        grid = self.tune if grid is None else grid
        keys = list(grid)
        return [{**self.fixed, **dict(zip(keys, values))} for values in product(*(grid[k] for k in keys))]

    def builder(self) -> str:
        """What builds the strategy, as stored in the records."""
        if self.factory is not None:
            return f"{self.factory.__module__}.{self.factory.__qualname__}"
        return str(self.strategy)

    def with_tune(self, **tune) -> Method:
        """A copy with other candidate values (``None`` drops a tuned setting).

        Args:
            **tune: ``setting=[candidates]`` replacing (or adding) that setting's candidates;
                ``setting=None`` removes it from the tuned settings.

        Returns:
            A new :class:`Method` (this one is unchanged).

        Raises:
            TypeError: a candidate list is not a list.
            ValueError: a candidate list is empty.
        """
        new = {k: v for k, v in {**self.tune, **tune}.items() if v is not None}
        return dataclasses.replace(self, tune=new, extend=tuple(k for k in self.extend if k in new))


# The settings that are scales (a step, a penalty, an exponent, a rate): the edge rule extends
# them geometrically past the ends of their grid.
SCALE_SETTINGS = ("server_lr", "effective_lr", "mu", "alpha", "q", "lambda_lr", "lam")
_STEP = [1.0, 2.0, 4.0]
# Every method of the book with three candidates per tuned setting (its server step, and its own
# knob where it has one), geometric, around the value its chapter found good for a few dozen
# rounds. A pick at an end of its grid is not final: the protocol's edge rule extends the grid
# there (BenchmarkProtocol.edge_cap). FedAvgM's step is tuned in units of its long-run step
# effective_lr = eta_s / (1 - beta) (the step a constant update gets once the momentum has
# built up), so that its grid is comparable with FedAvg's; the package default, eta_s = 1 with
# beta = 0.9, is effective_lr = 10, the top of the grid.
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("fedavg", tune={"server_lr": _STEP}),
        Method("fedavgm", tune={"effective_lr": [2.5, 5.0, 10.0], "momentum": [0.5, 0.7, 0.9]}),
        Method("fedprox", tune={"server_lr": _STEP, "mu": [0.01, 0.1, 1.0]}),
        Method("scaffold", tune={"server_lr": _STEP}),
        Method("feddyn", tune={"server_lr": _STEP, "alpha": [0.01, 0.1, 1.0]}),
        Method("fednova", tune={"server_lr": _STEP}),
        Method(
            "fedadam",
            tune={"server_lr": [0.01, 0.03, 0.1]},
            note="FedAdam on the clients' size-weighted mean update",
        ),
        Method("fedyogi", tune={"server_lr": [0.01, 0.03, 0.1]}),
        Method("fedadagrad", tune={"server_lr": [0.01, 0.03, 0.1]}),
        Method("qfedavg", tune={"server_lr": _STEP, "q": [0.2, 1.0, 5.0]}),
        Method(
            "afl",
            tune={"server_lr": _STEP, "lambda_lr": [0.01, 0.1, 1.0]},
            note="AFL's last iterate of the global model (not the average of its iterates)",
        ),
        Method("fedfv", tune={"server_lr": _STEP}),
        Method("fedlf", tune={"server_lr": _STEP}),
        Method("craft", tune={"server_lr": [0.3, 1.0, 3.0]}),
        Method("config", tune={"server_lr": [0.05, 0.1, 0.3]}),
        Method(
            "fedvg",
            tune={"server_lr": _STEP},
            server_validation=0.1,
            note="FedVG: 10 % of every client's training data is the server's validation set",
        ),
        Method("fedoui", tune={"server_lr": _STEP}),
        Method("fedalign", tune={"server_lr": _STEP}),
        Method(
            "ditto",
            tune={"server_lr": _STEP, "lam": [0.1, 1.0, 10.0]},
            note="personal: each client's own model (Ditto), not the global one",
        ),
        Method(
            "ifca",
            tune={"server_lr": _STEP, "num_clusters": [2, 3, 4]},
            note="cluster: each client's cluster model (IFCA), not one global model",
        ),
    )
}

# The robust rules and DP-FedAvg (chapter *When clients misbehave*): the robust rules at their
# package defaults (f: the largest their rule tolerates with the round's clients; beta = 0.1;
# clip and tau = 1), DP-FedAvg at a fixed clipping norm C = 0.5 (about the median norm of an
# update of the robust grid's federation) with noise multipliers z = 0 (clipping only) to 1.
_DP_CLIP = 0.5
_ROBUST_RULES = (
    "median",
    "trimmedmean",
    "krum",
    "multikrum",
    "bulyan",
    "geometricmedian",
    "centeredclipping",
    "normclipping",
)
_DP_NOISE = (0.0, 0.1, 0.3, 1.0)
METHODS.update(
    {
        m.name: m
        for m in (
            *(Method(name, tune={"server_lr": _STEP}) for name in _ROBUST_RULES),
            *(
                Method(
                    f"dp{z:g}",
                    strategy="dpfedavg",
                    fixed={"clip": _DP_CLIP, "noise_multiplier": z},
                    tune={"server_lr": _STEP},
                    note=f"DP-FedAvg, clip {_DP_CLIP:g}, noise multiplier {z:g}",
                )
                for z in _DP_NOISE
            ),
        )
    }
)

# The personalised and decentralised baselines and client-conditional FL (chapter *One model,
# many clients*): none keeps one plain global model. Local-only training has no server step, nor
# have Gossip and DAC (a client adds its update to its mixed model, theta_i <- theta_i + Delta_i),
# so these three have one candidate. Gossip (Zec et al.'s "Random": neighbours drawn uniformly
# each round, averaged by data size) and DAC receive the chapter's 3 models per round, DAC at its
# package temperature tau = 30. Conditional FL is FedAvg on the federation's model made
# conditional: each client's fingerprint (l = 32 eigenvalues, x 2.5, the chapter's scale without
# a public reference) joins the features where the model's head starts; its step is tuned.
_CONDITIONAL = {"num_eigenvalues": 32, "cond_scale": 2.5}
_NEIGHBOURS = 3
METHODS.update(
    {
        m.name: m
        for m in (
            Method(
                "local",
                note="personal: each client's own model trained on its own data alone (no server step to tune)",
            ),
            Method(
                "gossip",
                fixed={"num_neighbours": _NEIGHBOURS},
                note=(
                    f"personal: each client's own model (Gossip, {_NEIGHBOURS} random neighbours per round, "
                    "averaged by data size); no server step, neighbours fixed"
                ),
            ),
            Method(
                "dac",
                fixed={"num_neighbours": _NEIGHBOURS, "tau": 30.0},
                note=(
                    f"personal: each client's own model (DAC, {_NEIGHBOURS} neighbours per round drawn by loss, "
                    "tau 30 fixed at the package default); no server step"
                ),
            ),
            Method(
                "conditional",
                fixed=_CONDITIONAL,
                tune={"server_lr": [1.0, 2.0, 4.0]},
                note=(
                    "conditional: the one global conditional model, each client evaluated with its own "
                    f"fingerprint (l = {_CONDITIONAL['num_eigenvalues']}, x {_CONDITIONAL['cond_scale']:g}) as input"
                ),
            ),
        )
    }
)

# The chapter's grid: every method the book teaches (Local, Gossip and DAC have no server step).
CLASSROOM_METHODS = (
    "fedavg",
    "fedavgm",
    "fedprox",
    "scaffold",
    "feddyn",
    "fednova",
    "fedadam",
    "fedyogi",
    "qfedavg",
    "afl",
    "fedfv",
    "fedlf",
    "craft",
    "fedvg",
    "fedoui",
    "ditto",
    "ifca",
    "config",
    "fedalign",
    "local",
    "gossip",
    "dac",
    "conditional",
)
# Four kinds of heterogeneity, and one with cluster structure (client-conditional FL's setting).
CLASSROOM_FEDERATIONS = ("quantity:1.0", "dirichlet:0.1", "shards:2", "noisy:0.8", "clusters:4")
# The robust grid (chapter *When clients misbehave*): every robust rule, the re-weighting rules of
# the book and DP-FedAvg; one moderately non-IID federation without and with attackers (10 % and
# 30 % of the clients, four kinds), and two of stronger heterogeneity without an attacker.
ROBUST_METHODS = ("fedavg", "fedvg", "fedoui", *_ROBUST_RULES, *(f"dp{z:g}" for z in _DP_NOISE))
ROBUST_FEDERATIONS = (
    "dirichlet:0.5",
    *(
        f"dirichlet:0.5+{kind}:{fraction}"
        for kind in ("label_flip", "sign_flip", "gaussian", "alie")
        for fraction in (0.1, 0.3)
    ),
    "dirichlet:0.1",
    "shards:2",
)


def fixed_step(m, server_lr: float) -> Method:
    """A copy of a method whose server step is fixed at ``server_lr`` (no longer tuned).

    Args:
        m: a :class:`Method` or a name of :data:`METHODS`.
        server_lr: eta_s > 0.

    Returns:
        The new :class:`Method` (its other tuned settings, if any, stay tuned).

    Raises:
        TypeError: ``server_lr`` is not a real number.
        ValueError: ``server_lr`` is not a finite number > 0.
    """
    m = method(m)
    server_lr = check_positive(server_lr, "server_lr")
    tune = {k: v for k, v in m.tune.items() if k != "server_lr"}
    extend = tuple(k for k in m.extend if k != "server_lr")
    return dataclasses.replace(m, fixed={**m.fixed, "server_lr": server_lr}, tune=tune, extend=extend)


def method(spec) -> Method:
    """A :class:`Method` from a name of :data:`METHODS` or of a registered strategy (or a Method, as it is).

    A registered strategy without an entry in :data:`METHODS` (a user's, registered with
    :func:`~fedlearn_edu.strategies.register`) is tuned as FedAvg is: its ``server_lr`` over
    FedAvg's grid when its constructor takes one, nothing tuned otherwise. For another grid,
    pass a :class:`Method`.

    Args:
        spec: a name of :data:`METHODS` or :data:`~fedlearn_edu.strategies.STRATEGIES` (case,
            ``-`` and ``_`` ignored: ``"FedAvg-M"`` is ``"fedavgm"``) or a :class:`Method`.

    Returns:
        The :class:`Method`.

    Raises:
        TypeError: ``spec`` is neither a string nor a Method.
        ValueError: the name is neither in :data:`METHODS` nor registered.
    """
    from ..strategies import STRATEGIES, strategy_parameters

    if isinstance(spec, Method):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"A method is a name or a benchmark.Method, got {spec!r}.")
    key = spec.lower().replace("-", "").replace("_", "")
    if key in METHODS:
        return METHODS[key]
    if key in STRATEGIES:
        return Method(key, tune={"server_lr": _STEP} if "server_lr" in strategy_parameters(key) else {})
    raise ValueError(
        f"Unknown method {spec!r}; choose one of {','.join(sorted(METHODS))}, a registered strategy's name, "
        "or pass a benchmark.Method."
    )

"""A fair, resumable benchmark of the strategies: tune each method's step, evaluate on fresh seeds.

The protocol (issue "which method, when"; chapter *Comparing the methods*):

1. **Grid.** Methods (a name -> a strategy factory, fixed settings and the settings to
   tune with their candidate values: every method's server step ``server_lr`` and its own
   knob where it has one) x federations (dataset, partition and its parameters, number of
   clients, model) x seeds, with the rounds and the local training shared by all methods.
2. **Tune** every method on every federation over the *tuning seeds* (3 by default); pick the
   candidate with the highest criterion (default: the mean over the last ``last_k``
   evaluations of the mean client accuracy, averaged over the tuning seeds; a failed run
   scores ``-inf``; ties go to the first candidate in the grid's order). **Edge rule:** while a
   pick sits at an end of its grid in a scale setting (:attr:`Method.extend`), the grid is
   extended there geometrically and tuned again, at most ``Protocol.edge_cap`` times per end;
   picks still at an end are flagged (``BenchmarkResult.edges``).
3. **Evaluate** the pick on the *evaluation seeds* (10 by default), disjoint from the tuning
   seeds (the records say which run was which: column ``phase``).
   A method with a single candidate (nothing to tune) is not tuned: its candidate is the
   pick and only its evaluation runs execute.
4. **Summarise** per method x federation over the evaluation seeds: final and last-k mean
   accuracy, worst-10 %, std across clients, rounds to a target accuracy, seconds per round,
   each as the mean with a 95 % Student-t interval over seeds, and the paired comparison with
   FedAvg on the same seeds (:mod:`fedlearn_edu.stats`): the difference and its interval, the
   paired t-test, the effect size, an exact sign-flip permutation check, Holm's correction
   within each (federation, metric) family, Benjamini-Hochberg's across the decision guide, a
   TOST against ``Protocol.margin`` and the minimum detectable difference. Verdicts:
   **better/worse** (Holm-adjusted p < alpha), **equivalent** (the TOST passes), otherwise
   **inconclusive**; the intervals are conditional on the picks. Tables are never rankings.

A seed ``s`` seeds everything of one run: the partition (and label noise, and FedVG's
server validation split), the model's initial parameters and :func:`~fedlearn_edu.simulate`'s
client sampling and batch orders. All methods see the same federations on the same seed, so
differences between methods on one seed are paired.

Records are tidy: one row per run x evaluation round, with every setting as a column. Each
run is stored under ``<out>/runs/<key>.csv`` + ``<key>.json`` where ``key`` hashes the run's
full configuration and the package version; the ``.json`` is written last and holds the
SHA-256 of the ``.csv``, so a run killed while writing, or a file changed afterwards, is
detected and redone. The ``.json`` also holds the SHA-256 of the package's source
(``code_sha256``): a run computed by other code (or by code that did not record it) is
redone too. A rerun of the same sweep skips every run that is done. Sweeps sharing one
``out`` take turns on ``<out>/runs/.lock`` to check and to write a run, so none of them sees
another's run half written.

Runs execute in this process (``engine="sequential"``), in ``n_jobs`` worker processes
(``engine="joblib"``, loky backend) or on a Dask cluster (``engine="dask"``, a
``distributed.Client`` or a scheduler address). Each run uses one torch thread, on the CPU;
the results are identical whichever engine ran them.

>>> from fedlearn_edu import benchmark
>>> sorted(benchmark.METHODS)[:3]
['afl', 'bulyan', 'centeredclipping']
>>> benchmark.parse_federation("dirichlet:0.1").partition_params
{'alpha': 0.1}
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import numpy as np

from ..checks import check_int, check_positive, check_range, check_seed
from ..stats import VERDICTS, t_interval

__all__ = [
    "Method",
    "FederationSpec",
    "Protocol",
    "METHODS",
    "CLASSROOM_METHODS",
    "CLASSROOM_FEDERATIONS",
    "ROBUST_METHODS",
    "ROBUST_FEDERATIONS",
    "ATTACK_SETTINGS",
    "records_folder",
    "fixed_step",
    "parse_federation",
    "method",
    "run_configs",
    "run",
    "execute",
    "load",
    "classroom_records",
    "RECORDS_URL",
    "select",
    "summarize",
    "t_interval",
    "format_table",
    "BenchmarkResult",
    "METRICS",
    "TESTED_METRICS",
    "GUIDE_METRICS",
    "SCALE_SETTINGS",
    "plot_curves",
    "plot_intervals",
    "markdown_report",
    "verdict_counts",
    "rerun",
    "git_commit",
]

# 2: several tuning seeds, the edge rule (each pick's final grid and edge flags in protocol.json),
# corrected tests in summary.csv. load() converts records of version 1 (no grids, no edge flags).
RECORD_VERSION = 2
# The classroom grid's committed records, as files of the project's repository; the chapter
# *Comparing the methods* reads them. $FEDLEARN_BENCHMARK_URL replaces the base (tests serve a
# local folder); $FEDLEARN_BENCHMARK_RECORDS names a folder to read instead of the repository's.
RECORDS_URL = "https://raw.githubusercontent.com/fedlearn-edu/fedlearn-edu/main/benchmarks/results/classroom"
RECORDS_URL_VAR = "FEDLEARN_BENCHMARK_URL"
RECORDS_DIR_VAR = "FEDLEARN_BENCHMARK_RECORDS"
RECORD_FILES = ("records.csv.gz", "runs.csv", "protocol.json")  # what :func:`load` reads
# The records in the repository this package sits in (an editable install or a clone).
REPO_RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "classroom"
_RECORD_COLUMNS = {
    "records.csv.gz": ("run_key", "phase", "method", "federation", "settings", "seed", "round", "mean", "worst10"),
    "runs.csv": ("run_key", "phase", "method", "federation", "seed", "status", "config"),
}
METRICS = ("final", "lastk", "worst10", "std", "rounds_to_target", "sec_per_round")
# The metrics compared with the baseline seed by seed (paired tests, corrections, verdicts); the
# decision guide reads the first three; fewer rounds to the target is better.
TESTED_METRICS = ("lastk", "worst10", "rounds_to_target", "final")
GUIDE_METRICS = ("lastk", "worst10", "rounds_to_target")
LOWER_IS_BETTER = ("rounds_to_target",)
# Per tested metric M, the summary's columns X_M besides d_M, d_M_ci and vs_M.
_TEST_COLUMNS = ("n", "sd", "p", "dz", "p_perm", "p_holm", "q", "tost", "tost_holm", "mdd")
# The criterion's default window: the last 5 evaluations (every one of a shorter run).
LAST_K = 5
# Columns of a run's rows that are computed by the run (the rest are its settings).
VALUE_COLUMNS = ("round", "mean", "std", "worst10", "best10", "loss", "train_loss")


# --------------------------------------------------------------------------- the grid


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
        TypeError: a field of the wrong type (``fixed``/``tune`` not mappings, ``strategy`` not a
            name, ``factory`` not callable).
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
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Method name must be a non-empty string, got {self.name!r}.")
        if self.factory is None and self.strategy is None:
            object.__setattr__(self, "strategy", self.name)
        if self.factory is not None and not callable(self.factory):
            raise TypeError(f"Method factory must be callable, got {self.factory!r}.")
        if self.strategy is not None and not isinstance(self.strategy, str):
            raise TypeError(f"Method {self.name!r}: strategy must be a strategy's name, got {self.strategy!r}.")
        for what in ("fixed", "tune"):
            if not isinstance(getattr(self, what), Mapping):
                raise TypeError(
                    f"Method {self.name!r}: {what} must be a mapping {{setting: ...}}, got {getattr(self, what)!r}."
                )
        check_range(self.server_validation, "server_validation", 0.0, 1.0, high_open=True)
        if not isinstance(self.note, str):
            raise TypeError(f"Method {self.name!r}: note must be a string, got {self.note!r}.")
        for key, values in dict(self.tune).items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
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
            ValueError: a candidate list is empty or not a list.
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
# there (Protocol.edge_cap). FedAvgM's step is tuned in units of its long-run step
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
# The attack's parameters a federation string's attack gets (recorded in the run's key): the
# scaling attack multiplies by 10, the Gaussian one sends N(0, 1) per coordinate; the rest use
# :class:`~fedlearn_edu.attacks.Attack`'s defaults.
ATTACK_SETTINGS = {"scale": {"scale": 10.0}, "gaussian": {"sigma": 1.0}}


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
    """A :class:`Method` from a name of :data:`METHODS` (or a Method, returned as it is).

    Args:
        spec: a name of :data:`METHODS` (case, ``-`` and ``_`` ignored: ``"FedAvg-M"`` is
            ``"fedavgm"``) or a :class:`Method`.

    Returns:
        The :class:`Method`.

    Raises:
        TypeError: ``spec`` is neither a string nor a Method.
        ValueError: the name is not in :data:`METHODS`.
    """
    if isinstance(spec, Method):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"A method is a name or a benchmark.Method, got {spec!r}.")
    key = spec.lower().replace("-", "").replace("_", "")
    if key not in METHODS:
        raise ValueError(
            f"Unknown method {spec!r}; choose one of {','.join(sorted(METHODS))} or pass a benchmark.Method."
        )
    return METHODS[key]


@dataclass(frozen=True)
class FederationSpec:
    """One federation of the grid (built anew for every seed).

    Args:
        name: the label in the records (e.g. ``"dirichlet:0.1"``).
        dataset: a name :func:`~fedlearn_edu.data.load_dataset` accepts.
        partition: ``"iid"``, ``"dirichlet"``, ``"shards"`` or ``"quantity"``; or ``"clusters"``:
            ``num_clusters`` clusters of ``num_clients / num_clusters`` clients each whose data
            differ by ``shift`` (:func:`~fedlearn_edu.data.shifted_federation`, with
            ``num_samples // num_clients`` samples per client when ``num_samples`` is given).
        partition_params: ``alpha`` / ``shards_per_client`` / ``sigma`` / ``min_size``; for
            ``"clusters"``: ``num_clusters`` and ``shift`` (``"label"``, ``"concept"`` ...).
        num_clients: N.
        model: a name :func:`~fedlearn_edu.make_model` accepts.
        noisy_clients: share of the clients whose training labels are flipped (0: none).
        noise_fraction: share of a noisy client's training labels flipped.
        num_samples: keep a random subset of this many samples (quick runs).
        attack: a kind of :data:`fedlearn_edu.attacks.ATTACKS` (``""``: no attacker).
        attack_fraction: the share of the clients that attack (chosen by the run's seed).
        attack_params: the :class:`~fedlearn_edu.attacks.Attack`'s other fields (``scale``,
            ``sigma``).
        root: the dataset folder (not part of the run's key).

    Raises:
        TypeError: a field of the wrong type (a name that is not a string, a count that is not
            an integer, parameters that are not a mapping).
        ValueError: an unknown dataset, model, partition or attack; ``partition_params`` the
            partition does not take or out of range (as :func:`parse_federation` checks them);
            ``num_samples`` below ``num_clients``; an ``attack_fraction`` that rounds to no
            attacker or to every client; ``attack_params`` that set the seed, kind or fraction.
    """

    name: str
    dataset: str = "digits"
    partition: str = "dirichlet"
    partition_params: Mapping = field(default_factory=dict)
    num_clients: int = 20
    model: str = "mlp"
    noisy_clients: float = 0.0
    noise_fraction: float = 0.0
    num_samples: int | None = None
    attack: str = ""
    attack_fraction: float = 0.0
    attack_params: Mapping = field(default_factory=dict)
    root: str | None = field(default=None, compare=False)

    def __post_init__(self):
        from ..data import PARTITIONS

        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"FederationSpec name must be a non-empty string, got {self.name!r}.")
        _check_names(self.dataset, self.model)
        if not isinstance(self.partition, str) or (self.partition not in PARTITIONS and self.partition != CLUSTERS):
            raise ValueError(f"Unknown partition {self.partition!r}; choose one of {[*PARTITIONS, CLUSTERS]}.")
        check_int(self.num_clients, "num_clients", 2)
        if self.num_samples is not None:
            check_int(self.num_samples, "num_samples", self.num_clients)
        check_range(self.noisy_clients, "noisy_clients", 0.0, 1.0)
        check_range(self.noise_fraction, "noise_fraction", 0.0, 1.0)
        for what in ("partition_params", "attack_params"):
            if not isinstance(getattr(self, what), Mapping):
                raise TypeError(f"{what} must be a mapping {{name: value}}, got {getattr(self, what)!r}.")
        if self.root is not None and not isinstance(self.root, (str, os.PathLike)):
            raise TypeError(f"root must be a folder's path or None, got {self.root!r}.")
        object.__setattr__(self, "partition_params", dict(self.partition_params))
        object.__setattr__(self, "attack_params", dict(self.attack_params))
        if self.partition == CLUSTERS:
            _check_clusters(self.partition_params, self.num_clients)
        else:
            _check_partition_params(self.partition, self.partition_params)
        if not isinstance(self.attack, str):
            raise TypeError(f"attack must be a kind such as 'sign_flip' or '' (none), got {self.attack!r}.")
        if self.attack:
            from ..attacks import ATTACKS, Attack, num_attackers

            if self.attack not in ATTACKS or self.attack == "model_replacement":
                kinds = [k for k in ATTACKS if k != "model_replacement"]
                raise ValueError(f"attack must be one of {kinds} (or ''), got {self.attack!r}.")
            check_range(self.attack_fraction, "attack_fraction", 0.0, 1.0, low_open=True, high_open=True)
            try:  # round(fraction N) attackers: refused when that is none or every client
                num_attackers(self.attack_fraction, self.num_clients)
            except ValueError as err:
                raise ValueError(f"attack_fraction ({self.attack}): {err}") from None
            fixed = sorted(set(self.attack_params) & {"kind", "fraction", "seed", "target"})
            if fixed:
                raise ValueError(
                    f"attack_params may not set {fixed}: the kind and fraction are the spec's, the attackers are "
                    f"drawn with the run's seed; got {self.attack_params!r}."
                )
            try:
                Attack(self.attack, self.attack_fraction, **self.attack_params)  # the parameters are valid
            except (TypeError, ValueError) as err:  # an unknown field, or a value Attack refuses
                known = [
                    f.name for f in dataclasses.fields(Attack) if f.name not in ("kind", "fraction", "seed", "target")
                ]
                raise ValueError(f"attack_params takes {known}; got {self.attack_params!r} ({err})") from None
        elif not _is_zero(self.attack_fraction) or self.attack_params:
            raise ValueError("attack_fraction and attack_params need an attack kind (attack='sign_flip', ...).")

    def config(self) -> dict:
        """The settings that define the federation (the run key hashes them).

        Without an attacker the attack fields are left out, so that the keys of federations
        without one are those of the records written before the fields existed.
        """
        d = dataclasses.asdict(self)
        d.pop("root")
        if not self.attack:
            for name in ("attack", "attack_fraction", "attack_params"):
                d.pop(name)
        return d


_PARAM = {"dirichlet": "alpha", "shards": "shards_per_client", "quantity": "sigma"}
# A federation of clusters: K groups of clients whose data differ by a shift (label shift, where
# client-conditional FL's fingerprints see the clusters; chapter *One model, many clients*).
CLUSTERS = "clusters"
CLUSTER_SHIFT = "label"


def _check_names(dataset, model) -> None:
    """Raise unless ``dataset`` and ``model`` are names the package knows (no file is read)."""
    from ..data.datasets import dataset_info
    from ..models import MODELS

    for what, value in (("dataset", dataset), ("model", model)):
        if not isinstance(value, str):
            raise TypeError(
                f"{what} must be a name such as {'digits' if what == 'dataset' else 'mlp'!r}, got {value!r}."
            )
    dataset_info(dataset)  # "Unknown dataset ..."
    if model.lower().replace("-", "").replace("_", "") not in MODELS:
        raise ValueError(f"Unknown model {model!r}; choose one of {sorted(MODELS)}.")


# The partition_params each partition takes: a positive number, or a positive / non-negative integer.
_PARTITION_PARAMS = {
    "iid": {},
    "dirichlet": {"alpha": "positive", "min_size": "count"},
    "shards": {"shards_per_client": "integer"},
    "quantity": {"sigma": "positive", "min_size": "count"},
}


def _check_partition_params(partition: str, params: Mapping) -> None:
    """Raise unless ``params`` are keys ``partition`` takes, with valid values (as :func:`parse_federation`'s)."""
    allowed = _PARTITION_PARAMS.get(partition, {})
    unknown = sorted(set(params) - set(allowed), key=str)
    if unknown:
        raise ValueError(
            f"partition_params of a {partition!r} partition take {sorted(allowed)}; got unknown {unknown} "
            f"in {params!r}."
        )
    for key, value in params.items():
        name = f"partition_params[{key!r}]"
        if allowed[key] == "positive":
            check_positive(value, name)
        else:
            check_int(value, name, 1 if allowed[key] == "integer" else 0)


def _is_zero(value) -> bool:
    """``value`` is the number 0 (not ``False``, ``None`` or an empty container)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and value == 0


def _check_clusters(params: Mapping, num_clients: int) -> None:
    """Raise ValueError unless ``params`` define K >= 2 equal clusters of ``num_clients`` and a known shift."""
    from ..data.shifts import parse_shift

    if set(params) != {"num_clusters", "shift"}:
        raise ValueError(f"partition='{CLUSTERS}' takes partition_params num_clusters and shift, got {params!r}.")
    k = params["num_clusters"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ValueError(f"num_clusters must be an integer >= 2, got {k!r}.")
    if num_clients % k:
        raise ValueError(f"{num_clients} clients cannot form {k} clusters of equal size; use a divisor of num_clients.")
    if not isinstance(params["shift"], str) or not parse_shift(params["shift"]):
        raise ValueError(f"shift must name a shift such as 'label' or 'concept', got {params['shift']!r}.")


def parse_federation(text, **common) -> FederationSpec:
    """A :class:`FederationSpec` from a short string.

    ``"iid"``, ``"dirichlet:ALPHA"``, ``"shards:PER_CLIENT"``, ``"quantity:SIGMA"`` (log-normal
    client sizes, IID labels), or ``"noisy:FRACTION"``: Dirichlet alpha = 1 where 30 % of the
    clients have ``FRACTION`` of their training labels flipped (test labels stay clean), or
    ``"clusters:K"``: K clusters of equally many clients that differ by a label shift (each cluster
    its own classes, :func:`~fedlearn_edu.data.shifted_federation`; drawn by the run's seed).
    ``"+KIND:FRACTION"`` after any of them adds attackers: that share of the clients attacks
    with ``KIND`` of :data:`fedlearn_edu.attacks.ATTACKS` (``"dirichlet:0.5+sign_flip:0.3"``),
    with the parameters :data:`ATTACK_SETTINGS` gives the kind.

    Args:
        text: the string (or a FederationSpec, returned with ``common`` applied).
        common: other FederationSpec fields (``dataset``, ``num_clients``, ``model`` ...).
    """
    if isinstance(text, FederationSpec):
        return dataclasses.replace(text, **common) if common else text
    if not isinstance(text, str):
        raise TypeError(f"A federation is a string like 'dirichlet:0.1' or a FederationSpec, got {text!r}.")
    if "+" in text:
        base, _, attack = text.strip().partition("+")
        kind, _, value = attack.strip().partition(":")
        kind = kind.strip().lower()
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(
                f"Federation {text!r}: the attack is KIND:FRACTION, e.g. 'sign_flip:0.3'; got {attack!r}."
            ) from None
        spec = parse_federation(base, **common)
        return dataclasses.replace(
            spec,
            name=text.strip(),
            attack=kind,
            attack_fraction=fraction,
            attack_params=dict(ATTACK_SETTINGS.get(kind, {})),
        )
    kind, _, value = text.strip().partition(":")
    kind = kind.lower()
    try:
        number = float(value) if value else None
    except ValueError:
        raise ValueError(f"Federation {text!r}: {value!r} is not a number.") from None
    if number is not None and (not math.isfinite(number) or number <= 0):
        raise ValueError(f"Federation {text!r}: the parameter must be a positive number.")
    if kind == "iid":
        if value:
            raise ValueError(f"Federation {text!r}: 'iid' takes no parameter.")
        return FederationSpec(text, partition="iid", **common)
    if kind in _PARAM:
        if number is None:
            raise ValueError(f"Federation {text!r}: give the parameter, e.g. '{kind}:1'.")
        param = int(number) if kind == "shards" else number
        if kind == "shards" and param != number:
            raise ValueError(f"Federation {text!r}: shards per client must be an integer.")
        return FederationSpec(text, partition=kind, partition_params={_PARAM[kind]: param}, **common)
    if kind == "noisy":
        if number is None or number > 1:
            raise ValueError(f"Federation {text!r}: give the flipped share in (0, 1], e.g. 'noisy:0.8'.")
        return FederationSpec(
            text,
            partition="dirichlet",
            partition_params={"alpha": 1.0},
            noisy_clients=0.3,
            noise_fraction=number,
            **common,
        )
    if kind == CLUSTERS:
        if number is None or number != int(number) or number < 2:
            raise ValueError(f"Federation {text!r}: give the number of clusters, an integer >= 2, e.g. 'clusters:4'.")
        params = {"num_clusters": int(number), "shift": CLUSTER_SHIFT}
        return FederationSpec(text, partition=CLUSTERS, partition_params=params, **common)
    raise ValueError(
        f"Unknown federation {text!r}; use iid, dirichlet:ALPHA, shards:PER_CLIENT, quantity:SIGMA, noisy:FRACTION "
        "or clusters:K."
    )


@dataclass(frozen=True)
class Protocol:
    """The shared settings: seeds, rounds, local training, selection, edge rule and statistics.

    Args:
        tuning_seeds: seeds of the tuning runs (the pick maximises the mean over them; 3 by
            default, so that one lucky seed does not decide).
        eval_seeds: seeds of the evaluation runs (at least 2; disjoint from ``tuning_seeds``;
            10 by default). The intervals are *conditional on the picks*: the tuning's own
            variance is not in them.
        rounds, clients_per_round, local_epochs, batch_size, lr: shared by every method.
        last_k: the criterion and the ``lastk`` metrics average the last ``last_k`` evaluations
            (``None``: 5, or ``rounds`` when the run is shorter).
        target: the accuracy of ``rounds_to_target``, in ``(0, 1]``.
        engine: :func:`~fedlearn_edu.simulate`'s engine: ``"auto"`` (vmap where it applies),
            ``"vmap"`` or ``"loop"``.
        alpha: the level of every test (after correction).
        margin: the equivalence margin of the accuracy metrics (a fraction: 0.02 = 2 points);
            a difference is *equivalent* only when a TOST against ``+-margin`` passes.
        edge_cap: the edge rule: while a pick sits at an end of its grid in a setting the
            method lets it extend (:attr:`Method.extend`), one more candidate is added beyond
            that end (the grid's ratio at that end: x2 for a grid 1, 2, 4), at most ``edge_cap``
            times per end; a pick still at an end is flagged. ``0`` turns the rule off.

    Raises:
        TypeError: ``tuning_seeds`` or ``eval_seeds`` is not a sequence.
        ValueError: any other field of the wrong type or out of range (bools are not numbers;
            seeds are below 2**64), seeds shared by both phases, ``last_k > rounds``, an
            unknown ``engine``.
    """

    tuning_seeds: tuple = (0, 1, 2)
    eval_seeds: tuple = tuple(range(3, 13))
    rounds: int = 30
    clients_per_round: int = 10
    local_epochs: int = 1
    batch_size: int = 10
    lr: float = 0.1
    last_k: int | None = None
    target: float = 0.8
    engine: str = "auto"
    alpha: float = 0.05
    margin: float = 0.02
    edge_cap: int = 3

    def __post_init__(self):
        from ..engine import ENGINES

        for name in ("tuning_seeds", "eval_seeds"):
            given = getattr(self, name)
            if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, (Sequence, range, np.ndarray)):
                raise TypeError(f"{name} must be a sequence of seeds such as (0, 1, 2), got {given!r}.")
            seeds = tuple(given)
            if any(not isinstance(s, (int, np.integer)) or isinstance(s, (bool, np.bool_)) for s in seeds):
                raise ValueError(f"{name} must be non-negative integers, got {seeds!r}.")
            for s in seeds:
                check_seed(s, name)
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"{name} holds a seed twice: {seeds!r}.")
            object.__setattr__(self, name, tuple(int(s) for s in seeds))
        if not self.tuning_seeds:
            raise ValueError("tuning_seeds must hold at least one seed.")
        if len(self.eval_seeds) < 2:
            raise ValueError(f"eval_seeds must hold at least 2 seeds for an interval, got {self.eval_seeds!r}.")
        both = set(self.tuning_seeds) & set(self.eval_seeds)
        if both:
            raise ValueError(f"tuning_seeds and eval_seeds must be disjoint; both hold {sorted(both)}.")
        for name in ("rounds", "clients_per_round", "local_epochs", "batch_size", "last_k"):
            if name == "last_k" and self.last_k is None:  # the default: the last 5 evaluations, or all of fewer
                object.__setattr__(self, "last_k", min(LAST_K, int(self.rounds)))
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}.")
        if self.last_k > self.rounds:
            raise ValueError(f"last_k={self.last_k} exceeds rounds={self.rounds}.")
        for name, v, high, high_open in (
            ("lr", self.lr, None, False),
            ("target", self.target, 1.0, False),
            ("alpha", self.alpha, 1.0, True),
            ("margin", self.margin, 1.0, True),
        ):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(f"{name} must be a number, got {v!r} ({type(v).__name__}).")
            check_range(v, name, 0.0, high, low_open=True, high_open=high_open)
        if not isinstance(self.engine, str) or self.engine not in ("auto", *ENGINES):
            raise ValueError(f"engine must be one of {['auto', *sorted(ENGINES)]}, got {self.engine!r}.")
        if isinstance(self.edge_cap, bool) or not isinstance(self.edge_cap, (int, np.integer)) or self.edge_cap < 0:
            raise ValueError(f"edge_cap must be a non-negative integer, got {self.edge_cap!r}.")

    def local(self) -> dict:
        """The settings every run of the sweep shares, as stored in a run's configuration.

        Returns:
            ``{"rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "engine"}``
            as plain ints, a float and a string.
        """
        return {
            "rounds": int(self.rounds),
            "clients_per_round": int(self.clients_per_round),
            "local_epochs": int(self.local_epochs),
            "batch_size": int(self.batch_size),
            "lr": float(self.lr),
            "engine": self.engine,
        }


# --------------------------------------------------------------------------- one run


def _version() -> str:
    from .. import __version__

    return __version__


_PACKAGE = Path(__file__).resolve().parents[1]  # fedlearn_edu


@functools.cache
def _code_sha256() -> str:
    """The SHA-256 of the package's source: every ``.py`` file under it, with its path.

    A run executes the package's code (its strategies, data, models, :func:`execute` ...), so a
    change to any of it (even a comment: the check is conservative) may change the run's
    numbers. Computed once per process.
    """
    digest = hashlib.sha256()
    for name in sorted(p.relative_to(_PACKAGE).as_posix() for p in _PACKAGE.rglob("*.py")):
        digest.update(f"{name}\0".encode())
        digest.update(hashlib.sha256((_PACKAGE / name).read_bytes()).digest())
    return digest.hexdigest()


def git_commit() -> str:
    """The package's git commit (with ``-dirty`` when the tree has changes), or ``"unknown"``."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _plain(value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def run_key(config: Mapping) -> str:
    """The run's key: a hash of its full configuration and the package version.

    Args:
        config: the run's configuration (as built by :func:`run`; JSON-able after
            NumPy scalars and tuples are made plain).

    Returns:
        16 hexadecimal characters (the start of the SHA-256 of the sorted JSON).
    """
    text = json.dumps({"config": _plain(config), "version": _version()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _config(m: Method, fed: FederationSpec, protocol: Protocol, settings: dict, seed: int, phase: str) -> dict:
    return {
        "method": m.name,
        "builder": m.builder(),
        "settings": _plain(settings),
        "server_validation": float(m.server_validation),
        "federation": fed.config(),
        "seed": int(seed),
        **protocol.local(),
        "phase": phase,
    }


_FED_CACHE: dict = {}


def _federation(spec: dict, seed: int, root):
    """The federation of one spec and seed (cached per process; never modified by a run)."""
    from ..data import federated_dataset

    key = (json.dumps(spec, sort_keys=True), seed, root)
    if key not in _FED_CACHE:
        fed = federated_dataset(
            spec["dataset"],
            spec["partition"],
            num_clients=spec["num_clients"],
            seed=seed,
            root=root,
            num_samples=spec["num_samples"],
            **spec["partition_params"],
        )
        if len(_FED_CACHE) > 16:
            _FED_CACHE.clear()
        _FED_CACHE[key] = fed
    return _FED_CACHE[key]


def _clustered_federation(spec: dict, seed: int, root):
    """The federation of a ``"clusters"`` spec and seed (cached per process like :func:`_federation`)."""
    from ..data import shifted_federation

    key = (json.dumps(spec, sort_keys=True), seed, root)
    if key not in _FED_CACHE:
        params, n = spec["partition_params"], spec["num_clients"]
        k = params["num_clusters"]
        if n % k:  # a spec written by hand: FederationSpec checks this
            raise ValueError(f"{n} clients cannot form {k} clusters of equal size.")
        per_client = None if spec["num_samples"] is None else spec["num_samples"] // n
        fed = shifted_federation(spec["dataset"], params["shift"], k, n // k, per_client, seed=seed, root=root)
        if len(_FED_CACHE) > 16:
            _FED_CACHE.clear()
        _FED_CACHE[key] = fed
    return _FED_CACHE[key]


def _strategy(config: dict, factory: Callable | None):
    """The run's strategy: its factory's, or the registry's (:func:`~fedlearn_edu.strategies.make_strategy`).

    A strategy built on a base (Ditto) gets the settings its constructor does not take through
    its base (FedAvg's ``server_lr``); builder ``"conditional"`` is FedAvg on a conditional model.
    """
    from ..strategies import FedAvg, make_strategy

    settings = dict(config["settings"])
    builder = config["builder"]
    if "effective_lr" in settings:  # a heavy-ball step in units of its long-run step eta_s / (1 - beta)
        settings["server_lr"] = settings.pop("effective_lr") * (1.0 - settings.get("momentum", 0.9))
    if factory is not None:
        return factory(**settings)
    if builder == "conditional":  # FedAvg on the conditional model: the condition's settings go to the model
        return FedAvg(**{k: v for k, v in settings.items() if k not in _CONDITIONAL})
    return make_strategy(builder, **settings)


def execute(config: dict, factory: Callable | None = None, root=None) -> dict:
    """Run one configuration; never raises (a failure is returned with its traceback).

    Args:
        config: one run's configuration (a ``config`` of ``runs.csv``): method, builder,
            settings, server_validation, federation spec, seed, rounds, clients_per_round,
            local_epochs, batch_size, lr, engine, phase.
        factory: the Method's strategy factory when it has one (``None``: the builder names a
            strategy of the package).
        root: the data folder passed to :func:`~fedlearn_edu.data.federated_dataset`
            (``None``: the default).

    Builder ``"conditional"`` (client-conditional FL) appends each client's fingerprint to its
    inputs (:func:`~fedlearn_edu.conditional.fingerprint_federation`, after any label noise: a
    client fingerprints the data it holds) and trains the federation's model made conditional
    (:func:`~fedlearn_edu.conditional.make_conditional_model`, same seed) with FedAvg; its
    ``evaluated`` is ``"conditional"``.

    Returns:
        ``{"status": "ok", "rows": [...], "seconds": s, "evaluated": ...}`` or
        ``{"status": "failed", "error": "...", "traceback": "..."}``.
    """
    import torch

    from ..data import add_label_noise, server_validation_split
    from ..models import make_model
    from ..simulation import simulate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed = config["seed"]
        spec = config["federation"]
        fed = (_clustered_federation if spec["partition"] == CLUSTERS else _federation)(spec, seed, root)
        settings = config["settings"]
        conditional = factory is None and config["builder"] == "conditional"
        if conditional and config["server_validation"] > 0:
            raise ValueError("Client-conditional FL takes no server validation set (its inputs carry a condition).")
        if config["server_validation"] > 0:  # a clean server set: split before the label noise
            fed, val = server_validation_split(fed, config["server_validation"], seed=seed)
            settings = {**settings, "val_data": val}
        strategy = _strategy({**config, "settings": settings}, factory)
        if spec["noisy_clients"] > 0:
            noisy = int(round(spec["noisy_clients"] * fed.num_clients))
            fed = add_label_noise(fed, noisy, spec["noise_fraction"], seed=seed)
        if conditional:  # each client's fingerprint rides along with its own inputs
            from ..conditional import fingerprint_federation, make_conditional_model

            shape, length = fed.input_shape, settings["num_eigenvalues"]
            fed = fingerprint_federation(fed, length)
            model = make_conditional_model(
                spec["model"], shape, fed.num_classes, length, seed=seed, cond_scale=settings["cond_scale"]
            )
        else:
            model = make_model(spec["model"], fed.input_shape, fed.num_classes, seed=seed)
        attack = None
        if spec.get("attack"):  # chosen by the run's seed: other attackers on every seed
            from ..attacks import Attack

            attack = Attack(spec["attack"], spec["attack_fraction"], seed=seed, **spec["attack_params"])
        history = simulate(
            fed,
            model,
            strategy,
            rounds=config["rounds"],
            clients_per_round=config["clients_per_round"],
            local_epochs=config["local_epochs"],
            batch_size=config["batch_size"],
            lr=config["lr"],
            eval_every=1,
            seed=seed,
            device="cpu",
            engine=config["engine"],
            progress=False,
            attack=attack,
        )
    except Exception as err:  # a failed run is a result: recorded, and the sweep goes on
        return {
            "status": "failed",
            "error": f"{type(err).__name__}: {' '.join(str(err).split())}"[:500],
            "traceback": traceback.format_exc()[-4000:],
        }
    finally:
        torch.set_num_threads(threads)
    from ..metrics import fairness_metrics

    rows = []
    for e, r in enumerate(history.eval_rounds):
        fm = fairness_metrics(history.client_accuracy[e])
        rows.append(
            {
                "round": int(r),
                "mean": fm["mean"],
                "std": fm["std"],
                "worst10": fm["worst10"],
                "best10": fm["best10"],
                "loss": float(np.nanmean(history.client_loss[e])),
                "train_loss": float(history.train_loss[r - 1]) if r > 0 else float("nan"),
            }
        )
    evaluated = "conditional" if conditional else history.evaluated
    return {"status": "ok", "rows": rows, "seconds": float(history.seconds), "evaluated": evaluated}


# --------------------------------------------------------------------------- storage


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _flat(config: dict, key: str) -> dict:
    """The run's settings as columns."""
    fed = config["federation"]
    out = {
        "run_key": key,
        "phase": config["phase"],
        "method": config["method"],
        "builder": config["builder"],
        "settings": json.dumps(config["settings"], sort_keys=True),
        "federation": fed["name"],
        "dataset": fed["dataset"],
        "partition": fed["partition"],
        "partition_params": json.dumps(fed["partition_params"], sort_keys=True),
        "num_clients": fed["num_clients"],
        "model": fed["model"],
        "noisy_clients": fed["noisy_clients"],
        "noise_fraction": fed["noise_fraction"],
        "num_samples": fed["num_samples"],
        "attack": fed.get("attack", ""),
        "attack_fraction": fed.get("attack_fraction", 0.0),
        "server_validation": config["server_validation"],
        "seed": config["seed"],
        **{k: config[k] for k in ("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "engine")},
    }
    for name, value in config["settings"].items():
        out[f"param_{name}"] = value
    return out


def _csv_bytes(config: dict, key: str, result: dict, meta: dict) -> bytes:
    import pandas as pd

    flat = _flat(config, key)
    rounds = config["rounds"]
    rows = [
        {**flat, **row, "evaluated": result["evaluated"], "sec_per_round": result["seconds"] / rounds, **meta}
        for row in result["rows"]
    ]
    buf = io.StringIO()
    pd.DataFrame(rows).to_csv(buf, index=False)
    return buf.getvalue().encode()


class _Store:
    """``<out>/runs/<key>.csv`` + ``<key>.json`` (written last, holding the csv's SHA-256).

    Checking a run (:meth:`status`) and writing one (:meth:`write`) hold an exclusive lock on
    ``runs/.lock``, so a sweep never takes another sweep's run, half written, for a damaged
    one; a lock held by a killed process is released with it.
    """

    STATUSES = ("ok", "failed")  # a manifest's status

    def __init__(self, out):
        self.out = Path(out)
        self.runs = self.out / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.redone: list[str] = []

    @contextlib.contextmanager
    def _locked(self):
        try:
            import fcntl
        except ImportError:  # not on POSIX: no lock (one sweep per folder)
            yield
            return
        fd = os.open(self.runs / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def status(self, key: str) -> str:
        """``"done"``, ``"failed"``, ``"missing"``, ``"corrupt"`` or ``"stale"`` (then the files are removed).

        ``"corrupt"``: a ``.csv`` without its ``.json``, or a ``.json`` that is not an object
        with this key, a status of :attr:`STATUSES` and the ``.csv``'s checksum. ``"stale"``: a
        run computed by other code than this package's (its ``code_sha256`` differs from
        :func:`_code_sha256`, or is missing: written before the check).
        """
        with self._locked():
            return self._status(key)

    def _status(self, key: str) -> str:
        meta_path, csv_path = self.runs / f"{key}.json", self.runs / f"{key}.csv"
        if not meta_path.exists():
            if csv_path.exists():  # killed between the two writes
                self._drop(key)
                return "corrupt"
            return "missing"
        try:
            meta = json.loads(meta_path.read_text())
            if not isinstance(meta, dict) or meta.get("key") != key:
                raise ValueError("key")
            if meta["status"] not in self.STATUSES:
                raise ValueError("status")
            if meta["status"] == "failed":
                return "failed"
            if _sha(csv_path.read_bytes()) != meta["csv_sha256"]:
                raise ValueError("checksum")
        except (OSError, ValueError, KeyError, TypeError):
            self._drop(key)
            return "corrupt"
        if meta.get("code_sha256") != _code_sha256():
            self._drop(key)
            return "stale"
        return "done"

    def _drop(self, key):
        self.redone.append(key)
        for suffix in (".json", ".csv"):
            (self.runs / f"{key}{suffix}").unlink(missing_ok=True)

    def write(self, key: str, config: dict, result: dict, meta: dict) -> None:
        record = {"key": key, "record_version": RECORD_VERSION, "config": config, **meta, "status": result["status"]}
        record["code_sha256"] = _code_sha256()
        if result["status"] == "ok":
            data = _csv_bytes(config, key, result, meta)
            record.update(csv_sha256=_sha(data), num_rows=len(result["rows"]), seconds=result["seconds"])
        else:
            record.update(error=result["error"], traceback=result["traceback"])
        manifest = json.dumps(record, indent=1, sort_keys=True).encode()
        with self._locked():  # the .csv and its .json: one step for every sweep that takes the lock
            if result["status"] == "ok":
                _atomic_write(self.runs / f"{key}.csv", data)
            else:
                (self.runs / f"{key}.csv").unlink(missing_ok=True)
            _atomic_write(self.runs / f"{key}.json", manifest)

    def meta(self, key: str) -> dict:
        return json.loads((self.runs / f"{key}.json").read_text())

    def frame(self, keys):
        import pandas as pd

        frames = [pd.read_csv(self.runs / f"{k}.csv") for k in keys]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# --------------------------------------------------------------------------- engines


def _iterate(jobs: list, engine: str, n_jobs: int | None, client, factories: dict, root):
    """Yield ``(index, result)`` as runs finish, whichever engine runs them."""
    if not jobs:
        return
    if engine == "sequential":
        for i, cfg in jobs:
            yield i, execute(cfg, factories.get(cfg["method"]), root)
    elif engine == "joblib":
        from joblib import Parallel, delayed

        workers = n_jobs or os.cpu_count() or 1
        if workers == 1:
            yield from _iterate(jobs, "sequential", 1, None, factories, root)
            return
        parallel = Parallel(
            n_jobs=workers,
            backend="loky",
            return_as="generator_unordered",
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        )
        calls = (delayed(_indexed)(i, cfg, factories.get(cfg["method"]), root) for i, cfg in jobs)
        yield from parallel(calls)
    elif engine == "dask":
        from distributed import as_completed

        own = None
        if client is None:
            raise ValueError("engine='dask' needs client= (a distributed.Client) or scheduler= (an address).")
        if isinstance(client, str):
            own = client = _connect(client)
        try:
            futures = [
                client.submit(_indexed, i, cfg, factories.get(cfg["method"]), root, pure=False) for i, cfg in jobs
            ]
            for future in as_completed(futures):
                try:
                    yield future.result()
                except Exception as err:  # a worker lost: the run is recorded as failed
                    i = futures.index(future)
                    yield jobs[i][0], {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": ""}
        finally:
            if own is not None:
                own.close()
    else:
        raise ValueError(f"Unknown engine {engine!r}; choose 'sequential', 'joblib' or 'dask'.")


def _indexed(i, cfg, factory, root):
    return i, execute(cfg, factory, root)


def _die_with_parent(parent: int, poll: float = 0.2) -> None:
    """A worker process's initializer: end the worker as soon as the sweep's process is gone.

    A worker whose parent (``parent``, the sweep's process id) dies, even by ``kill -9``, is
    given another parent; a daemon thread notices the change of ``os.getppid()`` within
    ``poll`` seconds and ends the worker, so no worker (and, with the last worker, no loky
    resource tracker) outlives the sweep.
    """

    def watch():
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="fedlearn-die-with-parent", daemon=True).start()


# --------------------------------------------------------------------------- the sweep


def run_configs(
    configs: Sequence[dict],
    out,
    *,
    engine: str = "joblib",
    n_jobs: int | None = None,
    client=None,
    factories: Mapping | None = None,
    root=None,
    progress: bool = True,
    desc: str = "runs",
    redone: list | None = None,
) -> dict:
    """Run the configurations not yet done under ``out``; return ``{key: status}``.

    Statuses: ``"cached"`` (done before), ``"done"``, ``"failed"``. A stored run is redone
    when its files are corrupt or partial, or when it was computed by other code (its
    manifest's ``code_sha256``, the hash of the package's source, differs from this package's,
    or is missing: written before the check); those keys are appended to ``redone``.
    Worker processes (``"joblib"``) end with the process that started them, even when it is
    killed. Several sweeps may share ``out`` (a lock makes each run's commit one step).

    Args:
        configs: the runs' configurations (duplicates, by :func:`run_key`, run once).
        out: the results folder; runs are stored under ``out/runs``.
        engine: ``"sequential"``, ``"joblib"`` or ``"dask"``.
        n_jobs: worker processes for ``"joblib"`` (``None``: the CPU count).
        client: for ``"dask"``: a ``distributed.Client`` or a scheduler address.
        factories: ``{method name: factory}`` for methods outside the package.
        root: the data folder (``None``: the default).
        progress: show a tqdm bar on stderr.
        desc: the bar's label.
        redone: a list to which the keys of corrupt, partial or stale runs found are appended.

    Returns:
        ``{run key: status}``, one entry per distinct configuration, in ``configs``' order.
    """
    store = _Store(out)
    meta = {"package_version": _version(), "git_commit": git_commit()}
    keys = [run_key(c) for c in configs]
    statuses, todo = {}, []
    for i, (key, cfg) in enumerate(zip(keys, configs)):
        if key in statuses:
            continue
        if store.status(key) == "done":
            statuses[key] = "cached"
        else:
            statuses[key] = "todo"
            todo.append((i, cfg))
    if redone is not None:
        redone.extend(store.redone)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(statuses), desc=desc, leave=True, file=sys.stderr)
        bar.update(sum(s == "cached" for s in statuses.values()))
    counts = {"cached": sum(s == "cached" for s in statuses.values()), "done": 0, "failed": 0}
    try:
        for i, result in _iterate(todo, engine, n_jobs, client, dict(factories or {}), root):
            key = keys[i]
            store.write(key, configs[i], result, meta)
            statuses[key] = "done" if result["status"] == "ok" else "failed"
            counts[statuses[key]] += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(counts, refresh=False)
    finally:
        if bar is not None:
            bar.close()
    return statuses


def _listed(value, what: str, kinds: tuple, example: str) -> list:
    """``value`` as a non-empty list: one item of ``kinds`` or an iterable of them; TypeError/ValueError otherwise."""
    if isinstance(value, kinds):
        return [value]
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be {example} or a list of them, got {value!r} ({type(value).__name__}).")
    items = list(value)
    if not items:
        raise ValueError(f"{what} is empty; give at least one ({example}).")
    return items


def _methods(methods, what: str = "methods") -> list[Method]:
    if methods is None:
        methods = CLASSROOM_METHODS
    ms = []
    for m in _listed(methods, what, (str, Method), "a method name such as 'fedavg' or a benchmark.Method"):
        try:
            ms.append(method(m))
        except (TypeError, ValueError) as err:
            raise type(err)(f"{what}: {err}") from None
    if "fedavg" not in [m.name for m in ms]:
        ms.insert(0, METHODS["fedavg"])  # the baseline of every paired difference
    names = [m.name for m in ms]
    if len(set(names)) != len(names):
        raise ValueError(f"{what} holds a name twice: {names!r}.")
    return ms


def _federations(federations, common) -> list[FederationSpec]:
    if federations is None:
        federations = ["dirichlet:0.1"]
    feds = []
    for f in _listed(
        federations, "federations", (str, FederationSpec), "a string like 'dirichlet:0.1' or a FederationSpec"
    ):
        try:
            feds.append(parse_federation(f, **common))
        except (TypeError, ValueError) as err:
            raise type(err)(f"federations: {err}") from None
    names = [f.name for f in feds]
    if len(set(names)) != len(names):
        raise ValueError(f"federations holds a name twice: {names!r}.")
    return feds


def _check_out(out) -> Path:
    """The results folder ``out`` as a Path, checked before any run: writable, ``runs`` a folder.

    Args:
        out: a folder's path (``str`` or ``os.PathLike``; ``~`` is expanded); it may not exist
            yet, but its parent folder must.

    Returns:
        The folder's :class:`~pathlib.Path`.

    Raises:
        TypeError: ``out`` is not a path (``None``, a number, bytes).
        ValueError: ``out`` is empty, is a file, has a ``runs`` that is not a folder, or cannot be
            written (read-only, or its parent folder does not exist).
    """
    if not isinstance(out, (str, os.PathLike)) or isinstance(out, bytes):
        raise TypeError(f"out must be a folder's path (a str or pathlib.Path), got {out!r} ({type(out).__name__}).")
    if not str(out).strip():
        raise ValueError("out is empty; name a results folder such as 'benchmark_runs' ('.' for this folder).")
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(out)!r} exists and is not a folder; name a folder.")
    if (path / "runs").exists() and not (path / "runs").is_dir():
        raise ValueError(
            f"out={str(out)!r} holds a file 'runs' where the runs' folder goes; move it or pick another out."
        )
    parent = path if path.exists() else path.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"out={str(out)!r}: folder {parent} does not exist; create it first.")
    folder = next(f for f in (path / "runs", path, parent) if f.is_dir())
    try:  # a probe file, removed at once: read-only folders and file systems are found before any run
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise ValueError(
            f"out={str(out)!r}: folder {folder} is not writable ({err.strerror or err}); pick a folder you may "
            "write to."
        ) from None
    return path


# How long run() waits for a Dask scheduler given by its address before it gives up.
DASK_TIMEOUT = 10.0


def _engine(engine, n_jobs, client, scheduler) -> str:
    """The engine after checking ``engine``, ``n_jobs``, ``client`` and ``scheduler`` together."""
    if client is not None and scheduler is not None:
        raise ValueError("Pass client= or scheduler=, not both.")
    if client is not None and (isinstance(client, (str, bytes)) or not callable(getattr(client, "submit", None))):
        raise TypeError(f"client must be a distributed.Client (pass an address as scheduler=), got {client!r}.")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler.strip()):
        raise TypeError(f"scheduler must be a Dask scheduler's address such as 'tcp://host:8786', got {scheduler!r}.")
    if engine is None:
        engine = "dask" if (client is not None or scheduler is not None) else "joblib"
    if engine not in ("sequential", "joblib", "dask"):
        raise ValueError(f"Unknown engine {engine!r}; choose 'sequential', 'joblib' or 'dask'.")
    if n_jobs is not None:
        check_int(n_jobs, "n_jobs", 1)
        if engine != "joblib":
            raise ValueError(f"n_jobs={n_jobs!r} applies to engine='joblib' only, not engine={engine!r}; drop it.")
    if engine != "dask" and (client is not None or scheduler is not None):
        given = "client" if client is not None else "scheduler"
        raise ValueError(
            f"{given}= applies to engine='dask' only, not engine={engine!r}; drop it or use engine='dask'."
        )
    if engine == "dask" and client is None and scheduler is None:
        raise ValueError("engine='dask' needs client= (a distributed.Client) or scheduler= (an address).")
    return engine


def _connect(scheduler: str):
    """A ``distributed.Client`` of the scheduler at ``scheduler``; ValueError when it does not answer."""
    from distributed import Client

    try:
        return Client(scheduler, timeout=DASK_TIMEOUT)
    except Exception as err:  # OSError, TimeoutError, or an AssertionError for a malformed address
        raise ValueError(
            f"scheduler={scheduler!r}: no Dask scheduler answered within {DASK_TIMEOUT:g} s "
            f"({type(err).__name__}: {' '.join(str(err).split())[:200]}); start it or check the address."
        ) from None


def _preflight(cells, protocol: Protocol, root, keep: bool = False) -> None:
    """Build what every run needs once, before the first run: a bad grid fails here, not in every run.

    Each federation is built on the first tuning seed with its model, and every candidate of a
    package method gets its strategy built. The federations stay in this process's cache only
    with ``keep`` (the sequential engine's runs then reuse them); worker processes build their own.
    """
    from ..models import make_model

    seed, done = protocol.tuning_seeds[0], set()
    for f, m in cells:
        spec = f.config()
        if f.name not in done:
            done.add(f.name)
            build = _clustered_federation if f.partition == CLUSTERS else _federation
            try:
                fed = build(spec, seed, root)
                make_model(f.model, fed.input_shape, fed.num_classes, seed=seed)
            except FileNotFoundError:
                raise
            except (ValueError, TypeError, KeyError, IndexError, RuntimeError, OSError) as err:
                raise ValueError(
                    f"federations: {f.name!r} cannot be built (seed {seed}): {type(err).__name__}: "
                    f"{' '.join(str(err).split())}"
                ) from None
            finally:
                if not keep:
                    _FED_CACHE.clear()
        if m.factory is not None or m.server_validation > 0:  # its own factory, or FedVG's data-bound set
            continue
        for settings in m.candidates():
            try:
                _strategy(_config(m, f, protocol, settings, seed, "tune"), None)
            except (ValueError, TypeError) as err:
                raise type(err)(
                    f"methods: {m.name!r} with settings {_plain(settings)!r}: {' '.join(str(err).split())}"
                ) from None


def run(
    methods=None,
    federations=None,
    *,
    out="benchmark_runs",
    protocol: Protocol | None = None,
    dataset: str = "digits",
    num_clients: int = 20,
    model: str = "mlp",
    num_samples: int | None = None,
    root=None,
    engine: str | None = None,
    n_jobs: int | None = None,
    client=None,
    scheduler: str | None = None,
    progress: bool = True,
    methods_for: Mapping | None = None,
    **protocol_kwargs,
) -> BenchmarkResult:
    """Tune, evaluate and summarise methods x federations with the fair protocol.

    Args:
        methods: names of :data:`METHODS` or :class:`Method` objects (default: the classroom
            methods); ``"fedavg"`` is added when missing (the paired differences' baseline).
        federations: strings for :func:`parse_federation` or :class:`FederationSpec` objects
            (default: ``["dirichlet:0.1"]``).
        out: the results folder (created; reruns skip what it holds).
        protocol: a :class:`Protocol` (``None``: one built from ``protocol_kwargs``).
        dataset: the dataset of every string federation (``"digits"``, ``"mnist"`` ...).
        num_clients: the number of clients of every string federation.
        model: the model of every string federation (a name of :func:`~fedlearn_edu.make_model`).
        num_samples: the samples drawn from the dataset (``None``: all of them).
        root: the data folder (``None``: the default).
        engine: ``"sequential"``, ``"joblib"`` (default; ``n_jobs`` processes) or ``"dask"``
            (default when ``client`` or ``scheduler`` is given).
        n_jobs: worker processes for ``"joblib"`` (``None``: all cores).
        client: a ``distributed.Client``.
        scheduler: a Dask scheduler address (instead of ``client``).
        progress: one progress bar over the runs of each phase.
        methods_for: ``{federation name: methods}``: the methods of those federations instead
            of ``methods`` (``"fedavg"`` is added when missing), e.g. the personalised methods on
            a clustered federation only.
        **protocol_kwargs: :class:`Protocol` fields (``rounds=20``, ``eval_seeds=(3, 4, 5)``
            ...), replacing those of ``protocol`` when both are given.

    Returns:
        A :class:`BenchmarkResult` (records, picks, summary); it is also written to ``out``.

    Everything is checked before the first run: the arguments, every federation (built once on
    the first tuning seed, with its model) and every candidate's strategy of the package's
    methods, so that a grid no run of which could succeed is refused, not run.

    Raises:
        TypeError: ``protocol`` is not a :class:`Protocol`; ``methods``, ``federations``,
            ``methods_for``, ``out``, ``client`` or ``scheduler`` of the wrong type.
        ValueError: no method or federation, an unknown engine or method, a federation or a
            candidate setting that cannot be built, a bad ``n_jobs``, ``n_jobs`` without the
            joblib engine, ``client``/``scheduler`` without the Dask one (or both), a scheduler
            that does not answer within :data:`DASK_TIMEOUT` seconds, federations with the same
            name, a ``methods_for`` key that names no federation of the grid, or an ``out`` that
            is empty, a file, holds a file ``runs`` or cannot be written.
        FileNotFoundError: a federation's dataset is not on disk.

    Example:
        >>> result = benchmark.run(["fedavg", "craft"], ["dirichlet:0.1"], rounds=20)  # doctest: +SKIP
        >>> print(result.table())  # doctest: +SKIP
    """
    if protocol is None:
        protocol = Protocol(**protocol_kwargs)
    elif protocol_kwargs:
        protocol = dataclasses.replace(protocol, **protocol_kwargs)
    if not isinstance(protocol, Protocol):
        raise TypeError(f"protocol must be a benchmark.Protocol, got {protocol!r}.")
    ms = _methods(methods)
    common = {"dataset": dataset, "num_clients": num_clients, "model": model, "num_samples": num_samples}
    common = {k: v for k, v in common.items() if v is not None}
    if root is not None:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a folder's path or None, got {root!r}.")
        common["root"] = str(root)
    feds = _federations(federations, common)
    own = {}
    if methods_for is not None and not isinstance(methods_for, Mapping):
        raise TypeError(f"methods_for must be a mapping {{federation name: methods}}, got {methods_for!r}.")
    for name, names in (methods_for or {}).items():
        if name not in [f.name for f in feds]:
            raise ValueError(f"methods_for names {name!r}, not a federation of the grid {[f.name for f in feds]!r}.")
        own[name] = _methods(names, f"methods_for[{name!r}]")
    cells = [(f, m) for f in feds for m in own.get(f.name, ms)]
    ms = list({m.name: m for _, m in cells}.values())
    engine = _engine(engine, n_jobs, client, scheduler)
    factories = {m.name: m.factory for m in ms if m.factory is not None}
    roots = {f.root for f in feds}
    data_root = roots.pop() if len(roots) == 1 else None
    redone: list = []
    opts = dict(
        engine=engine,
        n_jobs=n_jobs,
        client=client if client is not None else scheduler,
        factories=factories,
        root=data_root,
        progress=progress,
        redone=redone,
    )
    out = _check_out(out)
    _preflight(cells, protocol, data_root, keep=engine == "sequential")
    if scheduler is not None:
        opts["client"] = _connect(scheduler)
    started = time.perf_counter()
    try:
        picks, grids, edges, tune_cfgs, statuses = _tune(ms, feds, protocol, out, opts, cells)
        eval_cfgs = []
        for (fname, mname), settings in picks.items():
            if settings is None:
                continue
            m = next(x for x in ms if x.name == mname)
            f = next(x for x in feds if x.name == fname)
            eval_cfgs += [_config(m, f, protocol, settings, seed, "eval") for seed in protocol.eval_seeds]
        statuses.update(run_configs(eval_cfgs, out, desc="evaluation", **opts))
    finally:
        if scheduler is not None:
            opts["client"].close()
    result = BenchmarkResult.collect(out, tune_cfgs + eval_cfgs, statuses, ms, feds, protocol, picks)
    result.grids, result.edges = grids, edges
    result.wall_seconds = time.perf_counter() - started
    result.redone = redone
    result.save()
    return result


def _beyond(values: list, end: int) -> float:
    """The next value past one end of a geometric grid (its ratio at that end)."""
    a, b = (values[-1], values[-2]) if end == 1 else (values[0], values[1])
    return float(f"{a * a / b:.12g}")


def _tune(ms, feds, protocol: Protocol, out, opts, cells=None) -> tuple:
    """Tuning with the edge rule -> ``(picks, grids, edges, configs, statuses)``.

    Runs every candidate of every method's grid on the tuning seeds, picks (:func:`select`),
    and while a pick sits at an end of its grid in a setting of :attr:`Method.extend`, adds the
    next geometric value past that end (at most ``protocol.edge_cap`` per end) and runs again.
    ``grids[(federation, method)]`` is the final grid, ``edges[(federation, method)]`` maps each
    tuned setting whose pick is still at an end to ``"low"`` or ``"high"`` (for an extended
    setting: the cap was reached). ``cells``: the ``(federation, method)`` pairs to tune
    (``None``: every method on every federation).
    """
    cells = _cells(ms, feds) if cells is None else cells
    tunable = [(f, m) for f, m in cells if len(m.candidates()) > 1]
    grids = {(f.name, m.name): {k: list(v) for k, v in m.tune.items()} for f, m in cells}
    used = {(f.name, m.name): {k: [0, 0] for k in m.extend} for f, m in tunable}
    store, configs, statuses, wave = _Store(out), [], {}, 0
    while True:
        wave += 1
        new = []
        for f, m in tunable:
            for settings in m.candidates(grids[(f.name, m.name)]):
                for seed in protocol.tuning_seeds:
                    cfg = _config(m, f, protocol, settings, seed, "tune")
                    if run_key(cfg) not in statuses:
                        new.append(cfg)
        if not new:
            break
        desc = "tuning" if wave == 1 else f"tuning, edge rule {wave - 1}"
        statuses.update(run_configs(new, out, desc=desc, **opts))
        configs += new
        picks = select(_frame(store, configs, statuses), ms, feds, protocol, grids, cells)
        for f, m in tunable:
            pair, pick = (f.name, m.name), picks[(f.name, m.name)]
            for k in m.extend if pick is not None else ():
                values = grids[pair][k]
                for end, at in ((1, values[-1]), (0, values[0])):
                    if len(values) > 1 and pick[k] == at and used[pair][k][end] < protocol.edge_cap:
                        used[pair][k][end] += 1
                        values.insert(len(values) if end else 0, _beyond(values, end))
                        break
    picks = select(_frame(store, configs, statuses), ms, feds, protocol, grids, cells)
    edges = {}
    for f, m in tunable:
        pair, pick = (f.name, m.name), picks[(f.name, m.name)]
        if pick is None:
            continue
        at = {}
        for k, v in grids[pair].items():
            if len(set(v)) > 1 and pick[k] in (min(v), max(v)):
                at[k] = "high" if pick[k] == max(v) else "low"
        if at:
            edges[pair] = at
    return picks, grids, edges, configs, statuses


def _frame(store: _Store, configs, statuses):
    keys = [k for k in dict.fromkeys(run_key(c) for c in configs) if statuses.get(k) in ("done", "cached")]
    return store.frame(keys)


def _cells(methods, federations) -> list:
    return [(f, m) for f in federations for m in methods]


def select(tune_records, methods, federations, protocol: Protocol, grids: Mapping | None = None, cells=None) -> dict:
    """``{(federation, method): settings}``: the tuning pick (``None`` when every candidate failed).

    The criterion: the mean over the tuning seeds of the mean client accuracy averaged over the
    last ``protocol.last_k`` evaluations; a failed or missing run scores ``-inf``; ties go to
    the first candidate in the grid's order. A method with a single candidate picks it (it has
    no tuning runs).

    Args:
        tune_records: the tuning runs' tidy records (a DataFrame with columns ``federation,
            method, settings`` (sorted JSON), ``seed, round, mean``; may be empty).
        methods: the :class:`Method` s of the grid.
        federations: the :class:`FederationSpec` s of the grid.
        protocol: gives ``tuning_seeds`` and ``last_k``.
        grids: ``{(federation, method): {setting: candidates}}``, the grids as the edge rule
            extended them (``None``: every method's own ``tune``).
        cells: the ``(FederationSpec, Method)`` pairs to pick for (``None``: every method on
            every federation).

    Returns:
        ``{(federation name, method name): settings dict or None}``.
    """
    picks = {}
    for f, m in _cells(methods, federations) if cells is None else cells:
        if len(m.candidates()) == 1:  # nothing to tune (no tuning run)
            picks[(f.name, m.name)] = _plain(m.candidates()[0])
            continue
        grid = (grids or {}).get((f.name, m.name), m.tune)
        best, best_score = None, -math.inf
        for settings in m.candidates(grid):
            text = json.dumps(_plain(settings), sort_keys=True)
            scores = []
            for seed in protocol.tuning_seeds:
                rows = (
                    tune_records[
                        (tune_records["federation"] == f.name)
                        & (tune_records["method"] == m.name)
                        & (tune_records["settings"] == text)
                        & (tune_records["seed"] == seed)
                    ]
                    if len(tune_records)
                    else []
                )
                if len(rows) == 0:
                    scores.append(-math.inf)
                    continue
                s = _lastk(rows.sort_values("round")["mean"].to_numpy(), protocol.last_k)
                scores.append(s if math.isfinite(s) else -math.inf)
            score = float(np.mean(scores))
            if score > best_score:
                best, best_score = settings, score
        picks[(f.name, m.name)] = _plain(best) if best is not None else None
    return picks


def _lastk(values: np.ndarray, k: int) -> float:
    return float(np.mean(values[-k:]))


# --------------------------------------------------------------------------- statistics


def _per_seed(rows, protocol: Protocol) -> dict:
    rows = rows.sort_values("round")
    mean = rows["mean"].to_numpy()
    k = protocol.last_k
    reached = rows["round"].to_numpy()[mean >= protocol.target]
    return {
        "final": float(mean[-1]),
        "lastk": _lastk(mean, k),
        "worst10": _lastk(rows["worst10"].to_numpy(), k),
        "std": _lastk(rows["std"].to_numpy(), k),
        "rounds_to_target": float(reached[0]) if reached.size else math.nan,
        "sec_per_round": float(rows["sec_per_round"].iloc[0]),
    }


def _family_stats(out: list, baseline: str, protocol: Protocol) -> None:
    """Corrections, verdicts and detectable differences, once every row's raw test is known.

    Holm within each (federation, metric) family of comparisons with the baseline (p-values and
    TOST p-values alike); Benjamini-Hochberg across every comparison of the guide's metrics
    (:data:`GUIDE_METRICS`) and, separately, across those of ``final``.
    """
    from .. import stats

    tested = [r for r in out if r["method"] != baseline]
    for metric in TESTED_METRICS:
        for fed in dict.fromkeys(r["federation"] for r in tested):
            family = [r for r in tested if r["federation"] == fed and math.isfinite(r[f"p_{metric}"])]
            for key, raw in ((f"p_holm_{metric}", f"p_{metric}"), (f"tost_holm_{metric}", f"tost_{metric}")):
                finite = [r for r in family if math.isfinite(r[raw])]
                for r, q in zip(finite, stats.holm([r[raw] for r in finite])):
                    r[key] = float(q)
            for r in family:
                sd, n = r[f"sd_{metric}"], r[f"n_{metric}"]
                r[f"mdd_{metric}"] = (
                    stats.min_detectable_difference(sd, n, protocol.alpha, 0.8, len(family)) if sd > 0 else 0.0
                )
    for scope in (GUIDE_METRICS, ("final",)):
        cells = [(r, m) for m in scope for r in tested if math.isfinite(r[f"p_{m}"])]
        for (r, m), q in zip(cells, stats.benjamini_hochberg([r[f"p_{m}"] for r, m in cells])):
            r[f"q_{m}"] = float(q)
    for r in tested:
        for metric in TESTED_METRICS:
            if not math.isfinite(r[f"p_{metric}"]):
                continue
            sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
            r[f"vs_{metric}"] = stats.verdict(
                sign * r[f"d_{metric}"], r[f"p_holm_{metric}"], r[f"tost_holm_{metric}"], protocol.alpha
            )


# The record columns summarize() reads.
_SUMMARY_INPUTS = ("phase", "federation", "method", "settings", "seed", "round", "mean", "worst10", "std", "evaluated")


def _summary_columns() -> list:
    """The columns of a :func:`summarize` frame (those of a summary without rows)."""
    cols = ["federation", "method", "settings", "n_seeds", "seeds", "evaluated"]
    for metric in METRICS:
        cols += [metric, f"{metric}_ci"] + (["reached"] if metric == "rounds_to_target" else [])
    for metric in TESTED_METRICS:
        cols += [f"{c}_{metric}" for c in _TEST_COLUMNS] + [f"d_{metric}", f"d_{metric}_ci", f"vs_{metric}"]
    return cols


def _check_metrics(metrics, allowed, what: str = "metrics") -> list:
    """``metrics`` (a name or a list of names) as a list, each one of ``allowed``."""
    names = [metrics] if isinstance(metrics, str) else metrics
    if not isinstance(names, Iterable) or isinstance(names, (bytes, Mapping)):
        raise TypeError(f"{what} must be a metric's name or a list of them, got {metrics!r}.")
    names = list(names)
    if not names:
        raise ValueError(f"{what} is empty; choose from {list(allowed)}.")
    for name in names:
        if name not in allowed:
            raise ValueError(f"{what}: unknown metric {name!r}; choose from {list(allowed)}.")
    return names


# What a table or report says when no evaluation run finished.
NOTHING_FINISHED = "No evaluation run finished: nothing to tabulate (every run failed or none ran)."


def summarize(records, protocol: Protocol | None = None, baseline: str = "fedavg", confidence: float = 0.95):
    """The evaluation runs' summary: one row per federation x method, with corrected verdicts.

    Columns: ``federation, method, settings, n_seeds, seeds, evaluated``; for every metric of
    :data:`METRICS` its mean and t-interval half-width over the seeds (``M``, ``M_ci``;
    ``rounds_to_target`` over the seeds that reached the target, ``reached`` of them); and for
    every metric of :data:`TESTED_METRICS` the paired comparison with the baseline on the
    seeds both have (``rounds_to_target``: only when both reached the target on every one):

    - ``d_M``, ``d_M_ci``: the mean difference and its t-interval half-width; ``n_M``, ``sd_M``;
    - ``p_M``: the two-sided paired t-test; ``dz_M``: the standardised effect mean/sd;
    - ``p_perm_M``: the exact sign-flip permutation p-value (a check; NaN below 6 seeds);
    - ``p_holm_M``: Holm-adjusted within the (federation, metric) family of comparisons;
    - ``q_M``: Benjamini-Hochberg across all comparisons of :data:`GUIDE_METRICS` (``final``:
      across its own);
    - ``tost_M``, ``tost_holm_M``: the equivalence test against ``+-protocol.margin`` (accuracy
      metrics only), raw and Holm-adjusted;
    - ``mdd_M``: the smallest difference the family's corrected test detects with 80 % power at
      this row's spread and seeds;
    - ``vs_M``: ``"better"``/``"worse"`` when ``p_holm_M < alpha`` (fewer rounds is better for
      ``rounds_to_target``), ``"equivalent"`` when ``tost_holm_M < alpha``, else
      ``"inconclusive"``; ``"baseline"`` on the baseline's row, ``"untested"`` without a test.

    Args:
        records: tidy records (DataFrame) with columns ``phase, federation, method, settings,
            seed, round, mean, worst10, std, sec_per_round, evaluated``; only
            ``phase == "eval"`` rows are used.
        protocol: gives ``last_k``, ``target``, ``alpha`` and ``margin`` (``None``: the default).
        baseline: the method the paired differences are taken to.
        confidence: the level of the t-intervals.

    Returns:
        A DataFrame, one row per federation x method present, in the records' order; without
        rows (but with every column) when no evaluation run finished.

    Raises:
        TypeError: ``records`` is not a DataFrame, or ``protocol`` not a :class:`Protocol`.
        ValueError: ``records`` has rows but lacks a column the summary needs.
    """
    import pandas as pd

    from .. import stats

    if not isinstance(records, pd.DataFrame):
        raise TypeError(f"records must be a pandas DataFrame of tidy records, got {type(records).__name__}.")
    if protocol is not None and not isinstance(protocol, Protocol):
        raise TypeError(f"protocol must be a benchmark.Protocol or None, got {protocol!r}.")
    protocol = protocol or Protocol()
    if len(records) == 0:
        return pd.DataFrame(columns=_summary_columns())
    missing = [c for c in _SUMMARY_INPUTS if c not in records.columns]
    if missing:
        raise ValueError(f"records lacks the columns {missing}; pass the tidy records of a sweep (result.records).")
    ev = records[records["phase"] == "eval"]
    if len(ev) == 0:
        return pd.DataFrame(columns=_summary_columns())
    per = {}
    for (fed, meth), g in ev.groupby(["federation", "method"], sort=False):
        per[(fed, meth)] = {int(seed): _per_seed(r, protocol) for seed, r in g.groupby("seed")}
    out = []
    for (fed, meth), seeds in per.items():
        g = ev[(ev["federation"] == fed) & (ev["method"] == meth)]
        row = {
            "federation": fed,
            "method": meth,
            "settings": g["settings"].iloc[0],
            "n_seeds": len(seeds),
            "seeds": ",".join(str(s) for s in sorted(seeds)),
            "evaluated": g["evaluated"].iloc[0],
        }
        for metric in METRICS:
            vals = np.array([seeds[s][metric] for s in sorted(seeds)])
            if metric == "rounds_to_target":
                row["reached"] = int(np.isfinite(vals).sum())
                vals = vals[np.isfinite(vals)]
            if vals.size >= 2:
                row[metric], row[f"{metric}_ci"] = stats.t_interval(vals, confidence)
            else:
                row[metric], row[f"{metric}_ci"] = (float(vals[0]) if vals.size else math.nan), math.nan
        base = per.get((fed, baseline))
        for metric in TESTED_METRICS:
            nan = dict.fromkeys(_TEST_COLUMNS, math.nan)
            row.update({f"{c}_{metric}": v for c, v in nan.items()})
            common = sorted(set(seeds) & set(base)) if base else []
            d = np.array([seeds[s][metric] - base[s][metric] for s in common])
            if meth == baseline:
                row.update({f"d_{metric}": 0.0, f"d_{metric}_ci": 0.0, f"vs_{metric}": "baseline"})
                continue
            row[f"vs_{metric}"] = "untested"
            if d.size < 2 or not np.isfinite(d).all():
                continue
            t = stats.paired_test(d, confidence)
            row.update(
                {
                    f"n_{metric}": t.n,
                    f"d_{metric}": t.mean,
                    f"d_{metric}_ci": t.half_width,
                    f"sd_{metric}": t.sd,
                    f"p_{metric}": t.p,
                    f"dz_{metric}": t.d_z,
                    f"p_perm_{metric}": stats.sign_flip_p(d) if t.n >= 6 else math.nan,
                }
            )
            if metric not in LOWER_IS_BETTER:
                row[f"tost_{metric}"] = stats.tost(d, protocol.margin)
        out.append(row)
    _family_stats(out, baseline, protocol)
    return pd.DataFrame(out)


def format_table(summary, metrics=("lastk", "worst10"), percent: bool = True, failed=()) -> str:
    """The summary as text: ``mean +- half-width`` per method (rows) x federation (columns).

    The paired difference to FedAvg follows each cell with its verdict and Holm-adjusted
    p-value: ``(+d +- h, better p=0.003)``. Rows keep the grid's order: the table is not a
    ranking. ``failed`` marks a method every run of which failed on a federation (the failure
    report names those); ``-`` one not in the grid there (``methods_for``).

    Args:
        summary: a :func:`summarize` DataFrame.
        metrics: the metrics to show, one block each (names of :data:`METRICS`).
        percent: show fractions as percentages.
        failed: the ``(federation, method)`` pairs every run of which failed (shown as
            ``failed``, with their row and column even when nothing else is in them).

    Returns:
        The table as lines of text, one block per metric; :data:`NOTHING_FINISHED` when the
        summary has no row.

    Raises:
        ValueError: a metric not in :data:`METRICS`, or a summary without its columns.
    """
    import pandas as pd

    metrics = _check_metrics(metrics, METRICS)
    if not isinstance(summary, pd.DataFrame):
        raise TypeError(f"summary must be a summarize() DataFrame, got {type(summary).__name__}.")
    if len(summary) == 0:
        return NOTHING_FINISHED + "\n"
    missing = [c for c in ("federation", "method", *metrics, *(f"{m}_ci" for m in metrics)) if c not in summary.columns]
    if missing:
        raise ValueError(f"summary lacks the columns {missing}; pass a summarize() DataFrame.")
    scale = 100.0 if percent else 1.0
    failed = {tuple(c) for c in failed}
    feds = list(dict.fromkeys([*summary["federation"], *(f for f, _ in failed)]))
    meths = list(dict.fromkeys([*summary["method"], *(m for _, m in failed)]))
    lines = []
    for metric in metrics:
        lines.append(
            f"{metric} ({'%' if percent else 'fraction'}; mean +- 95% t-interval over seeds; "
            "vs FedAvg: paired difference, verdict, Holm-adjusted p)"
        )
        width = max(len(m) for m in meths) + 2
        cells = {}
        for _, r in summary.iterrows():
            text = f"{scale * r[metric]:.1f}+-{scale * r[metric + '_ci']:.1f}"
            if f"vs_{metric}" in r and r[f"vs_{metric}"] not in ("baseline", "untested"):
                text += (
                    f" ({scale * r['d_' + metric]:+.1f}+-{scale * r['d_' + metric + '_ci']:.1f} "
                    f"{r['vs_' + metric]} p={r['p_holm_' + metric]:.2g})"
                )
            cells[(r["federation"], r["method"])] = text
        cells.update({c: "failed" for c in failed if c not in cells})
        colw = max([len(c) for c in cells.values()] + [len(f) for f in feds]) + 2
        lines.append("".ljust(width) + "".join(f.ljust(colw) for f in feds))
        for m in meths:
            lines.append(m.ljust(width) + "".join(cells.get((f, m), "-").ljust(colw) for f in feds))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- results


@dataclass
class BenchmarkResult:
    """What :func:`run` produced (and :func:`load` reads back).

    Attributes:
        out: the results folder.
        records: the tidy records (one row per run x evaluation round).
        runs: one row per run: key, phase, status, error, config (JSON), version, commit.
        picks: ``{(federation, method): settings}`` picked on the tuning seeds.
        protocol: the protocol used.
        failed: the runs that failed (key, method, federation, seed, error).
        redone: keys of corrupt, partial or stale (other code's) runs found and redone.
        grids: ``{(federation, method): {setting: candidates}}``, every grid as the edge rule
            left it.
        edges: ``{(federation, method): {setting: "low" | "high"}}`` for the picks still at an
            end of their grid (the edge rule's cap reached, or a setting it does not extend).
        record_version: the records' format (:data:`RECORD_VERSION`; 1 for converted older ones).
    """

    out: Path
    records: object
    runs: object
    picks: dict
    protocol: Protocol
    failed: list = field(default_factory=list)
    redone: list = field(default_factory=list)
    wall_seconds: float = math.nan
    grids: dict = field(default_factory=dict)
    edges: dict = field(default_factory=dict)
    record_version: int = RECORD_VERSION

    @classmethod
    def collect(cls, out, configs, statuses, methods, feds, protocol, picks):
        """Gather the stored runs of a sweep into a result.

        Args:
            out: the results folder.
            configs: every configuration of the sweep (tuning and evaluation).
            statuses: ``{run key: status}`` from :func:`run_configs` (not read: the stored
                ``.json`` says whether a run is done).
            methods: the grid's :class:`Method` s (not read; kept for the call's symmetry).
            feds: the grid's :class:`FederationSpec` s (not read).
            protocol: the :class:`Protocol` used.
            picks: ``{(federation, method): settings}`` from :func:`select`.

        Returns:
            A :class:`BenchmarkResult` with the done runs' records and one ``runs`` row per
            distinct configuration (``status`` ``"missing"`` when nothing was stored).
        """
        import pandas as pd

        store = _Store(out)
        rows, keys, failed = [], [], []
        for cfg in configs:
            key = run_key(cfg)
            if key in keys:
                continue
            keys.append(key)
            meta = store.meta(key) if (store.runs / f"{key}.json").exists() else {"status": "missing"}
            rows.append(
                {
                    "run_key": key,
                    "phase": cfg["phase"],
                    "method": cfg["method"],
                    "federation": cfg["federation"]["name"],
                    "seed": cfg["seed"],
                    "status": meta["status"],
                    "error": meta.get("error", ""),
                    "package_version": meta.get("package_version", ""),
                    "git_commit": meta.get("git_commit", ""),
                    "config": json.dumps(cfg, sort_keys=True),
                }
            )
            if meta["status"] != "ok":
                failed.append(rows[-1])
        done = [r["run_key"] for r in rows if r["status"] == "ok"]
        records = store.frame(done)
        if len(records):
            records = records.sort_values(["phase", "federation", "method", "settings", "seed", "round"], kind="stable")
            records = records.reset_index(drop=True)
        return cls(Path(out), records, pd.DataFrame(rows), picks, protocol, failed)

    def summary(self, baseline: str = "fedavg"):
        """:func:`summarize` of the evaluation runs, in the grid's order (methods are not ranked).

        Args:
            baseline: the method the paired differences are taken to.

        Returns:
            The :func:`summarize` DataFrame, rows ordered by federation then method as in the grid.
        """
        s = summarize(self.records, self.protocol, baseline)
        if len(s) == 0:
            return s
        s["edge"] = [
            ", ".join(f"{k} {side}" for k, side in self.edges.get((f, m), {}).items())
            for f, m in zip(s["federation"], s["method"])
        ]
        feds = list(dict.fromkeys(self.runs["federation"]))
        meths = list(dict.fromkeys(self.runs["method"]))
        order = s.apply(lambda r: (feds.index(r["federation"]), meths.index(r["method"])), axis=1)
        return s.iloc[np.argsort([a * 10_000 + b for a, b in order], kind="stable")].reset_index(drop=True)

    def table(self, metrics=("lastk", "worst10")) -> str:
        """:func:`format_table` of :meth:`summary`.

        Args:
            metrics: the metrics to show (names of :data:`METRICS`).

        Returns:
            The table as text, ``failed`` where every run of a method on a federation failed;
            when no evaluation run finished, a line that says so, how many runs failed and the
            :meth:`failure_report`.

        Raises:
            ValueError: a metric not in :data:`METRICS`.
        """
        s = self.summary()
        table = format_table(s, metrics, failed=self._failed_cells(s))
        if len(s) == 0:
            failed = f"{len(self.failed)} of {len(self.runs)} runs failed." if len(self.runs) else "No run ran."
            report = self.failure_report()
            table = "\n".join([f"{table.rstrip()} {failed}", *([report] if report else [])]) + "\n"
        return table

    def _failed_cells(self, summary) -> list:
        """The ``(federation, method)`` pairs that ran but have no row in ``summary``: every run failed."""
        done = set(zip(summary["federation"], summary["method"]))
        ran = dict.fromkeys(zip(self.runs["federation"], self.runs["method"])) if len(self.runs) else {}
        return [c for c in ran if c not in done]

    def failure_report(self) -> str:
        """What failed and how to rerun it ('' when nothing did)."""
        if not self.failed:
            return ""
        lines = [f"{len(self.failed)} run(s) failed (recorded in {self.out / 'runs.csv'}):"]
        for r in self.failed[:10]:
            lines.append(f"  {r['method']} on {r['federation']}, seed {r['seed']} ({r['phase']}): {r['error']}")
        if len(self.failed) > 10:
            lines.append(f"  ... and {len(self.failed) - 10} more")
        lines.append("Rerun the same command: runs that are done are skipped, failed ones are tried again.")
        return "\n".join(lines)

    def save(self) -> None:
        """Write ``records.csv.gz``, ``runs.csv``, ``summary.csv`` and ``protocol.json`` to ``out``."""
        import pandas as pd

        out = Path(self.out)
        # a sweep of which no run finished writes records without rows (never leaves an older sweep's)
        records = self.records if len(self.records) else pd.DataFrame(columns=_RECORD_COLUMNS["records.csv.gz"])
        buf = io.StringIO()
        records.to_csv(buf, index=False)
        data = io.BytesIO()
        with gzip.GzipFile(fileobj=data, mode="wb", mtime=0) as gz:
            gz.write(buf.getvalue().encode())
        _atomic_write(out / "records.csv.gz", data.getvalue())
        _atomic_write(out / "summary.csv", self.summary().to_csv(index=False).encode())
        _atomic_write(out / "runs.csv", self.runs.to_csv(index=False).encode())
        proto = {
            "record_version": RECORD_VERSION,
            **dataclasses.asdict(self.protocol),
            "picks": [
                {
                    "federation": f,
                    "method": m,
                    "settings": s,
                    "grid": self.grids.get((f, m), {}),
                    "edge": self.edges.get((f, m), {}),
                }
                for (f, m), s in self.picks.items()
            ],
            "package_version": _version(),
            "git_commit": git_commit(),
        }
        _atomic_write(out / "protocol.json", json.dumps(_plain(proto), indent=1).encode())


def load(out) -> BenchmarkResult:
    """Read a results folder written by :func:`run` (``records.csv.gz``, ``runs.csv``, ``protocol.json``).

    Args:
        out: the results folder (e.g. :func:`classroom_records`' answer).

    Returns:
        A :class:`BenchmarkResult` (``wall_seconds`` is NaN: it is not stored).

    Records of version 1 (written before the edge rule and the corrected tests) are converted:
    their runs and picks are read as they are, the statistics fields of :class:`Protocol` take
    their defaults, and ``grids``/``edges`` are empty (version 1 did not record them);
    ``record_version`` says which it was.

    Raises:
        TypeError: ``out`` is not a path.
        FileNotFoundError: one of the three files is missing.
        ValueError: the records are of a version this package does not know, or a file is
            damaged (the message names it).
    """
    import pandas as pd

    if not isinstance(out, (str, os.PathLike)) or isinstance(out, bytes):
        raise TypeError(f"out must be a results folder's path, got {out!r} ({type(out).__name__}).")
    out = Path(out)
    for name in ("records.csv.gz", "runs.csv", "protocol.json"):
        if not (out / name).exists():
            raise FileNotFoundError(f"{out / name} does not exist: is {str(out)!r} a benchmark results folder?")
    with _damaged(out / "protocol.json"):
        proto = json.loads((out / "protocol.json").read_text())
        if not isinstance(proto, dict) or not isinstance(proto.get("picks"), list):
            raise ValueError("not a JSON object with a list 'picks'")
    version = proto.pop("record_version", 1)
    if version not in (1, RECORD_VERSION):
        raise ValueError(
            f"{out / 'protocol.json'} holds benchmark records of version {version!r}; this package reads versions 1 "
            f"and {RECORD_VERSION}. Rerun the sweep with this package (the command is in the folder's README or "
            "report.md) into a new folder."
        )
    with _damaged(out / "protocol.json"):
        entries = proto.pop("picks")
        picks = {(p["federation"], p["method"]): p["settings"] for p in entries}
        grids = {(p["federation"], p["method"]): p["grid"] for p in entries if p.get("grid")}
        edges = {(p["federation"], p["method"]): p["edge"] for p in entries if p.get("edge")}
        fields = {f.name for f in dataclasses.fields(Protocol)}
        protocol = Protocol(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in proto.items() if k in fields})
    frames = {}
    options = {"records.csv.gz": dict(keep_default_na=True, low_memory=False), "runs.csv": dict(keep_default_na=False)}
    for name, kw in options.items():
        with _damaged(out / name):
            try:
                frames[name] = pd.read_csv(out / name, **kw)
            except pd.errors.EmptyDataError:
                raise ValueError("the file is empty") from None
            missing = [c for c in _RECORD_COLUMNS[name] if c not in frames[name].columns]
            if missing:
                raise ValueError(f"lacks the columns {missing}")
    records, runs = frames["records.csv.gz"], frames["runs.csv"]
    failed = runs[runs["status"] != "ok"].to_dict("records")
    result = BenchmarkResult(out, records, runs, picks, protocol, failed, grids=grids, edges=edges)
    result.record_version = version
    return result


@contextlib.contextmanager
def _damaged(path: Path):
    """Any error reading ``path`` inside the block becomes one ValueError that names the file."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OSError, EOFError) as err:
        raise ValueError(
            f"{path} is damaged or not a benchmark results file ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}); restore it, or rerun the sweep (the command is in the "
            "folder's README or report.md) into a new folder."
        ) from None


def _check_record_file(name: str, data: bytes) -> None:
    """Raise ValueError unless ``data`` is a readable ``name`` of a results folder."""
    import pandas as pd

    if name == "protocol.json":
        proto = json.loads(data.decode())
        missing = [k for k in ("picks", "tuning_seeds", "eval_seeds") if k not in proto]
    else:
        raw = gzip.decompress(data) if name.endswith(".gz") else data
        frame = pd.read_csv(io.BytesIO(raw), keep_default_na=False)
        missing = [c for c in _RECORD_COLUMNS[name] if c not in frame.columns]
        if not missing and len(frame) == 0:
            missing = ["any row"]
    if missing:
        raise ValueError(f"lacks {missing}")


GRIDS = ("classroom", "lab", "robust")  # the committed grids, folders of benchmarks/results


def classroom_records(root=None, download: bool = True) -> Path:
    """The folder of the classroom grid's records (the chapter *Comparing the methods*).

    :func:`records_folder` ``("classroom", root, download)``; see there.

    Args:
        root: the data folder downloads go under (``None``: the default).
        download: fetch the files when no folder holds them.

    Returns:
        The folder, holding at least :data:`RECORD_FILES`.
    """
    return records_folder("classroom", root, download)


def records_folder(grid: str = "classroom", root=None, download: bool = True) -> Path:
    """The folder of a committed grid's records, one of :data:`GRIDS` (``benchmarks/results/GRID``).

    ``"classroom"`` is the grid of the chapter *Comparing the methods* (bundled digits),
    ``"lab"`` its larger grid (Fashion-MNIST, 100 clients, 100 rounds), ``"robust"`` that of the
    chapter *When clients misbehave* (:data:`ROBUST_METHODS` x :data:`ROBUST_FEDERATIONS`).
    $FEDLEARN_BENCHMARK_RECORDS and $FEDLEARN_BENCHMARK_URL name the classroom grid's folder and
    base address; another grid's is the sibling folder (address) of that name.

    Looked for, in order (for the classroom grid): the folder ``$FEDLEARN_BENCHMARK_RECORDS``;
    the repository this package sits in (``benchmarks/results/classroom``, an editable install
    or a clone); ``../benchmarks/results/classroom`` (a chapter run from ``book/``); a copy
    downloaded before. Otherwise (a package installed from the index, on Colab) the files
    :func:`load` reads (:data:`RECORD_FILES`) are downloaded from :data:`RECORDS_URL` (or
    ``$FEDLEARN_BENCHMARK_URL``) into ``download_root(root)/benchmark-classroom``: each is
    checked (a gzip CSV or CSV with the expected columns, JSON with the protocol) and then
    renamed into place, so a broken download never sits there.

    Args:
        grid: ``"classroom"``, ``"lab"`` or ``"robust"``.
        root: the data folder downloads go under (``None``: ``$FEDLEARN_DATA``, else ``./data``;
            see :func:`fedlearn_edu.data.sources.download_root`).
        download: fetch the files when no folder holds them (ignored when
            ``$FEDLEARN_OFFLINE=1``).

    Returns:
        The folder, holding at least :data:`RECORD_FILES`; pass it to :func:`load`.

    Raises:
        FileNotFoundError: no folder holds the records and downloading is off.
        ConnectionError: a download failed (the URL is named).
        ValueError: a downloaded file is not what it should be (the URL is named), or an
            unknown grid.
    """
    import urllib.error
    import urllib.request

    from ..data.sources import OFFLINE_VAR, download_root, downloads_allowed

    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {', '.join(map(repr, GRIDS))}; got {grid!r}.")

    def sibling(path: Path) -> Path:
        return path if grid == "classroom" else path.parent / grid

    places = [sibling(Path(os.environ[RECORDS_DIR_VAR]).expanduser())] if os.environ.get(RECORDS_DIR_VAR) else []
    places += [sibling(REPO_RECORDS), Path("..") / "benchmarks" / "results" / grid]
    cache = download_root(root) / f"benchmark-{grid}"
    for place in [*places, cache]:
        if all((place / name).is_file() for name in RECORD_FILES):
            return place
    where = ", ".join(str(p) for p in [*places, cache])
    if not download or not downloads_allowed():
        why = f"${OFFLINE_VAR} is set" if download else "download=False"
        raise FileNotFoundError(
            f"The benchmark records ({', '.join(RECORD_FILES)}) are in none of: {where}; and {why}, so they "
            f"were not downloaded from {os.environ.get(RECORDS_URL_VAR) or RECORDS_URL}. Clone the repository "
            f"(github.com/fedlearn-edu/fedlearn-edu), set ${RECORDS_DIR_VAR} to a folder written by "
            f"`python -m fedlearn_edu benchmark --out FOLDER`, or allow the download."
        )
    base = (os.environ.get(RECORDS_URL_VAR) or RECORDS_URL).rstrip("/")
    if grid != "classroom":
        base = f"{base.rsplit('/', 1)[0]}/{grid}"
    cache.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        if (cache / name).is_file():
            continue
        url = f"{base}/{name}"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(
                f"Could not download {url} ({err}). Without a network: clone the repository "
                f"(github.com/fedlearn-edu/fedlearn-edu) and set ${RECORDS_DIR_VAR} to its "
                f"benchmarks/results/{grid}, or copy {', '.join(RECORD_FILES)} into {cache}."
            ) from err
        try:
            _check_record_file(name, data)
        except Exception as err:
            raise ValueError(
                f"{url} is not a benchmark {name} ({type(err).__name__}: {err}); nothing was written to {cache}. "
                f"Check ${RECORDS_URL_VAR} or copy the file from a clone of the repository."
            ) from err
        _atomic_write(cache / name, data)
    return cache


def rerun(records, key: str, root=None) -> dict:
    """Run the configuration of one recorded run again -> :func:`execute`'s result.

    Args:
        records: a ``runs`` DataFrame (``BenchmarkResult.runs``) with columns ``run_key`` and
            ``config``.
        key: the run's key.
        root: the data folder (``None``: the default).

    Returns:
        :func:`execute`'s dict for that configuration.

    Raises:
        ValueError: no run has that key.
    """
    row = records[records["run_key"] == key]
    if len(row) == 0:
        raise ValueError(f"No run with key {key!r} in the records.")
    return execute(json.loads(row["config"].iloc[0]), root=root)


# --------------------------------------------------------------------------- plots and report


def plot_curves(result: BenchmarkResult, metrics=("mean", "worst10"), methods=None, confidence: float = 0.95):
    """Per federation (columns) and metric (rows): the evaluation runs' curves over rounds.

    Each method's curve is the mean over the evaluation seeds with its t-interval as a band.

    Args:
        result: a :class:`BenchmarkResult`.
        metrics: record columns to plot, one row of panels each (fractions in ``[0, 1]``).
        methods: the methods to draw (``None``: all, in the grid's order).
        confidence: the level of the bands.

    Returns:
        The matplotlib figure, ``len(metrics)`` x number of federations panels.

    Raises:
        ValueError: no evaluation run finished (nothing to draw: see
            :meth:`BenchmarkResult.failure_report`), or a metric that is not a record column of
            :data:`VALUE_COLUMNS`.
    """
    import matplotlib.pyplot as plt
    from scipy import stats

    metrics = _check_metrics(metrics, VALUE_COLUMNS[1:])
    if not isinstance(result, BenchmarkResult):
        raise TypeError(f"result must be a benchmark.BenchmarkResult, got {type(result).__name__}.")
    if len(result.records) == 0 or len(result.records[result.records["phase"] == "eval"]) == 0:
        raise ValueError(f"{NOTHING_FINISHED[:-1]}; nothing to plot. {result.failure_report()}".strip())
    ev = result.records[result.records["phase"] == "eval"]
    feds = list(dict.fromkeys(result.runs["federation"]))
    meths = [m for m in dict.fromkeys(result.runs["method"]) if methods is None or m in methods]
    fig, axes = plt.subplots(len(metrics), len(feds), figsize=(4.2 * len(feds), 3.2 * len(metrics)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for j, fed in enumerate(feds):
        for i, metric in enumerate(metrics):
            ax = axes[i][j]
            for c, meth in enumerate(meths):
                g = ev[(ev["federation"] == fed) & (ev["method"] == meth)]
                if len(g) == 0:
                    continue
                table = g.pivot(index="round", columns="seed", values=metric)
                n = table.shape[1]
                mu = table.mean(axis=1).to_numpy()
                half = (
                    stats.t.ppf(0.5 + confidence / 2, n - 1) * table.std(axis=1, ddof=1).to_numpy() / math.sqrt(n)
                    if n > 1
                    else np.zeros_like(mu)
                )
                x = table.index.to_numpy()
                ax.plot(x, mu, color=cmap(c % 20), lw=1.2, label=meth)
                ax.fill_between(x, mu - half, mu + half, color=cmap(c % 20), alpha=0.15, lw=0)
            ax.set_title(f"{fed}: {metric}", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    return fig


def plot_intervals(summary, metric: str = "lastk"):
    """Per federation: each method's paired difference to FedAvg with its 95 % t-interval.

    Green / red: better / worse than FedAvg after Holm's correction within the federation;
    blue: equivalent (TOST within the protocol's margin); grey: inconclusive. The bars are the
    uncorrected 95 % intervals, so a bar that misses 0 can still be grey. Methods keep the
    grid's order: the plot is not a ranking.

    Args:
        summary: a :func:`summarize` DataFrame.
        metric: one of ``"lastk"``, ``"final"``, ``"worst10"`` (those with paired differences).

    Returns:
        The matplotlib figure, one panel per federation.

    Raises:
        TypeError: ``metric`` is not a string.
        ValueError: ``metric`` is not one of those, or the summary has no row (no evaluation
            run finished).
    """
    import matplotlib.pyplot as plt

    if not isinstance(metric, str):
        raise TypeError(f"metric must be a metric's name such as 'lastk', got {metric!r}.")
    _check_metrics(metric, ("lastk", "final", "worst10"), "metric")
    if len(summary) == 0:
        raise ValueError(f"{NOTHING_FINISHED[:-1]}; nothing to plot.")
    feds = list(dict.fromkeys(summary["federation"]))
    meths = list(dict.fromkeys(summary["method"]))
    fig, axes = plt.subplots(
        1, len(feds), figsize=(3.6 * len(feds), 0.28 * len(meths) + 1.2), squeeze=False, sharey=True
    )
    colour = {
        "better": "tab:green",
        "worse": "tab:red",
        "equivalent": "tab:blue",
        "inconclusive": "0.55",
        "baseline": "black",
        "untested": "white",
    }
    for j, fed in enumerate(feds):
        ax = axes[0][j]
        for y, meth in enumerate(meths):
            r = summary[(summary["federation"] == fed) & (summary["method"] == meth)]
            if len(r) == 0:
                continue
            r = r.iloc[0]
            d, h, verdict = 100 * r[f"d_{metric}"], 100 * r[f"d_{metric}_ci"], r[f"vs_{metric}"]
            if not math.isfinite(d):
                continue
            ax.errorbar(d, y, xerr=h if math.isfinite(h) else None, fmt="o", ms=3, capsize=2, color=colour[verdict])
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(fed, fontsize=9)
        ax.set_xlabel(f"{metric} minus FedAvg's (points)")
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].set_yticks(range(len(meths)), meths, fontsize=7)
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    return fig


def verdict_counts(summary, metrics=GUIDE_METRICS, alpha: float = 0.05) -> dict:
    """How many comparisons with the baseline say what, before and after the corrections.

    Args:
        summary: a :func:`summarize` DataFrame.
        metrics: the tested metrics to count over.
        alpha: the level.

    Returns:
        A dict of counts: ``tests`` (comparisons with a test), ``uncorrected`` (raw p below
        alpha), ``holm`` (Holm-adjusted p below alpha), ``bh`` (q below alpha), and one count
        per verdict: ``better``, ``worse``, ``equivalent``, ``inconclusive`` (the verdicts use
        Holm).
    """
    counts = dict.fromkeys(("tests", "uncorrected", "holm", "bh", *VERDICTS), 0)
    for metric in metrics:
        p = summary[f"p_{metric}"].to_numpy(dtype=float)
        tested = np.isfinite(p)
        counts["tests"] += int(tested.sum())
        counts["uncorrected"] += int((p[tested] < alpha).sum())
        counts["holm"] += int((summary[f"p_holm_{metric}"].to_numpy(dtype=float)[tested] < alpha).sum())
        counts["bh"] += int((summary[f"q_{metric}"].to_numpy(dtype=float)[tested] < alpha).sum())
        for word in VERDICTS:
            counts[word] += int((summary[f"vs_{metric}"] == word).sum())
    return counts


def markdown_report(result: BenchmarkResult, command: str = "") -> str:
    """A Markdown report: the protocol, power, the table with corrected verdicts, picks, failures.

    Args:
        result: a :class:`BenchmarkResult`.
        command: the command that ran the sweep, quoted in the report (``""``: none).

    Returns:
        The report as Markdown text.
    """
    from .. import stats

    p = result.protocol
    s = result.summary()
    failed = result._failed_cells(s)  # every run failed: a row and column of their own, marked so
    feds = list(dict.fromkeys([*s["federation"], *(f for f, _ in failed)]))
    meths = list(dict.fromkeys([*s["method"], *(m for _, m in failed)]))
    ran = set(zip(result.runs["federation"], result.runs["method"])) if len(result.runs) else set()
    commits = ", ".join(sorted({str(c)[:12] for c in result.runs.get("git_commit", []) if str(c)})) or "unknown"
    lines = ["# Benchmark report", ""]
    if len(s) == 0:
        lines += [
            f"**{NOTHING_FINISHED}** {len(result.failed)} of {len(result.runs)} runs failed; the failures are "
            "listed at the end.",
            "",
        ]
    if command:
        lines += ["Command:", "", f"    {command}", ""]
    lines += [
        f"Package {_version()}; the runs were computed at commit(s) {commits}. Tuning seeds "
        f"{list(p.tuning_seeds)}, evaluation seeds {list(p.eval_seeds)} (disjoint); {p.rounds} rounds, "
        f"{p.clients_per_round} clients per round, "
        f"{p.local_epochs} local epoch(s) of batch {p.batch_size} at lr {p.lr}. The pick maximises the mean over "
        f"the tuning seeds of the last-{p.last_k} mean client accuracy; a pick at an end of its grid extends the "
        f"grid there (at most {p.edge_cap} times per end). The intervals are conditional on the picks (the "
        "tuning's own variance is not in them).",
        "",
        f"Cells: mean over the {len(p.eval_seeds)} evaluation seeds of the last-{p.last_k} mean accuracy (%) +- "
        "the 95 % Student-t half-width; in brackets the paired difference to FedAvg on the same seeds, its verdict "
        f"and its Holm-adjusted p-value (within the federation). better / worse: adjusted p < {p.alpha:g}; "
        f"equivalent: a TOST within +-{100 * p.margin:g} points passes (Holm-adjusted); otherwise inconclusive. "
        "The table is not a ranking; - marks a method not run on that federation; a cell on fewer seeds than "
        "planned says how many (its failed runs are listed below, and the cell is over the runs that finished).",
        "",
        "| method | " + " | ".join(feds) + " |",
        "|---|" + "---|" * len(feds),
    ]
    for m in meths:
        cells = []
        for f in feds:
            r = s[(s["federation"] == f) & (s["method"] == m)]
            if len(r) == 0:
                cells.append("failed" if (f, m) in ran else "-")
                continue
            r = r.iloc[0]
            c = f"{100 * r['lastk']:.1f} +- {100 * r['lastk_ci']:.1f}"
            if int(r["n_seeds"]) < len(p.eval_seeds):
                c += f" [{int(r['n_seeds'])} of {len(p.eval_seeds)} seeds]"
            if r["vs_lastk"] not in ("baseline", "untested"):
                c += (
                    f" ({100 * r['d_lastk']:+.1f} +- {100 * r['d_lastk_ci']:.1f}, {r['vs_lastk']}, "
                    f"p={r['p_holm_lastk']:.2g})"
                )
            if r.get("edge"):
                c += f" [edge: {r['edge']}]"
            cells.append(c)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    sd = s["sd_lastk"].to_numpy(dtype=float)
    sd = sd[np.isfinite(sd) & (sd > 0)]
    if sd.size:
        family = max(1, int((s["vs_lastk"] != "baseline").groupby(s["federation"]).sum().max()))
        n = len(p.eval_seeds)
        med = float(np.median(sd))
        lines += [
            "",
            f"Power: the median standard deviation of a paired last-{p.last_k} difference is {100 * med:.2f} points; "
            f"with {n} seeds the smallest difference detected with 80 % power is "
            f"{100 * stats.min_detectable_difference(med, n, p.alpha):.1f} points uncorrected and "
            f"{100 * stats.min_detectable_difference(med, n, p.alpha, 0.8, family):.1f} points after the correction "
            f"for a family of {family} comparisons.",
        ]
    c = verdict_counts(s, alpha=p.alpha)
    lines += [
        "",
        f"Verdicts over the {c['tests']} comparisons of the guide's metrics ({', '.join(GUIDE_METRICS)}): "
        f"{c['uncorrected']} with p < {p.alpha:g} uncorrected, {c['holm']} after Holm within their families, "
        f"{c['bh']} with a Benjamini-Hochberg q < {p.alpha:g} across them; better {c['better']}, worse "
        f"{c['worse']}, equivalent {c['equivalent']}, inconclusive {c['inconclusive']}.",
        "",
        "Picked settings (tuning seeds), the grid each was picked from, and the picks still at an end of it:",
        "",
    ]
    for (f, m), settings in result.picks.items():
        text = json.dumps(settings, sort_keys=True) if settings is not None else "every candidate failed"
        grid = result.grids.get((f, m))
        if grid and any(len(v) > 1 for v in grid.values()):
            text += " from " + "; ".join(f"{k} {v}" for k, v in grid.items())
        edge = result.edges.get((f, m))
        if edge:
            text += " — at the edge: " + ", ".join(f"{k} {side}" for k, side in edge.items())
        lines.append(f"- {f}, {m}: {text}")
    report = result.failure_report()
    lines += ["", report if report else "No run failed.", ""]
    return "\n".join(lines)

"""The protocol every run of a sweep shares: :class:`BenchmarkProtocol` (seeds, rounds, selection, statistics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice, check_instance, check_int, check_range, check_seed

# The criterion's default window: the last 5 evaluations (every one of a shorter run).
LAST_K = 5


@dataclass(frozen=True)
class BenchmarkProtocol:
    """The shared settings: seeds, rounds, local training, selection, edge rule and statistics.

    It governs a whole sweep (tuning and evaluation seeds, the statistics), not one run, and is
    not a strategy's protocol (:class:`~fedlearn_edu.strategies.Strategy`) nor a
    :class:`typing.Protocol`; hence its name.

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
        TypeError: a field of the wrong type: ``tuning_seeds`` or ``eval_seeds`` not a sequence
            of integers, a count not an integer, a rate not a real number (bools are neither),
            ``engine`` not a string.
        ValueError: a field out of range (seeds are below 2**64), seeds shared by both phases,
            ``last_k > rounds``, an unknown ``engine``.
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
            seeds = tuple(check_seed(s, name) for s in given)  # TypeError for a seed that is not an integer
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"{name} holds a seed twice: {seeds!r}.")
            object.__setattr__(self, name, seeds)
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
            check_int(getattr(self, name), name, 1)
        if self.last_k > self.rounds:
            raise ValueError(f"last_k={self.last_k} exceeds rounds={self.rounds}.")
        for name, v, high, high_open in (
            ("lr", self.lr, None, False),
            ("target", self.target, 1.0, False),
            ("alpha", self.alpha, 1.0, True),
            ("margin", self.margin, 1.0, True),
        ):
            check_instance(v, name, (int, float, np.integer, np.floating), "a real number")
            check_range(v, name, 0.0, high, low_open=True, high_open=high_open)
        check_choice(self.engine, "engine", ["auto", *sorted(ENGINES)])
        check_int(self.edge_cap, "edge_cap", 0)

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

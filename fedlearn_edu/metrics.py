"""Fairness metrics over clients (METHODS.md, "Common ground")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["fairness_metrics", "METRIC_NAMES", "over_seeds", "format_over_seeds"]

METRIC_NAMES = {
    "mean": "mean accuracy over clients",
    "std": "standard deviation over clients",
    "worst10": "mean of the worst 10% of clients",
    "best10": "mean of the best 10% of clients",
}


def fairness_metrics(client_accuracy) -> dict[str, float]:
    """Summarise per-client accuracies of the global model.

    Args:
        client_accuracy: ``array[N]`` accuracy in ``[0, 1]`` of the global model on each
            client's local test split. NaN entries (clients without test data) are ignored;
            Inf or values outside ``[0, 1]`` raise ``ValueError``.

    Returns:
        ``{"mean", "std", "worst10", "best10"}``: the mean, the population standard
        deviation (ddof = 0), and the mean over the ``k = max(1, floor(0.1 N))``
        clients with the lowest / highest accuracy.

    Example:
        >>> fairness_metrics([0.1, 0.5, 0.9, 1.0])["worst10"]
        0.1
    """
    if isinstance(client_accuracy, (str, bytes)):
        raise TypeError("client_accuracy must be numbers in [0, 1], got a string.")
    try:
        acc = np.asarray(client_accuracy, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise TypeError(f"client_accuracy must be numbers in [0, 1] ({err}).") from None
    acc = acc[~np.isnan(acc)]
    if acc.size == 0:
        raise ValueError("fairness_metrics needs at least one client accuracy that is not NaN.")
    if not np.all((acc >= 0) & (acc <= 1)):
        bad = acc[~((acc >= 0) & (acc <= 1))][0]
        raise ValueError(f"client_accuracy must lie in [0, 1] (NaN: no test data); got {bad}.")
    k = max(1, math.floor(0.1 * acc.size))
    s = np.sort(acc)
    return {
        "mean": float(acc.mean()),
        "std": float(acc.std()),
        "worst10": float(s[:k].mean()),
        "best10": float(s[-k:].mean()),
    }


def over_seeds(values) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1) of one number measured over seeds.

    Args:
        values: ``array[S]``, the same measurement from ``S >= 2`` seeds.

    Returns:
        ``(mean, std)``.

    Example:
        >>> over_seeds([0.5, 0.7, 0.6])
        (0.6, 0.1)
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size < 2:
        raise ValueError(f"over_seeds needs the measurement from at least two seeds; got {v.size}.")
    return round(float(v.mean()), 12), round(float(v.std(ddof=1)), 12)


def format_over_seeds(runs: Mapping[str, Sequence], metrics: Sequence[str] = ("mean", "std", "worst10")) -> str:
    """Text table of final fairness metrics, mean ± 95 % half-width over seeds, one row per method.

    The ± is the book's: the half-width ``t_{0.975, S-1} sd / sqrt(S)`` of the Student-t
    interval of the mean over the ``S`` seeds (:func:`fedlearn_edu.stats.t_interval`), not the
    standard deviation.

    Args:
        runs: ``{method name: [History, ...]}``, one history per seed (``S >= 2``; objects with a
            ``metrics()`` method returning :func:`fairness_metrics`' keys).
        metrics: which of ``"mean"``, ``"std"``, ``"worst10"``, ``"best10"`` to show.

    Returns:
        The table as a string: ``mean ± half-width`` of each metric of the final model over the
        seeds.
    """
    from .stats import t_interval

    bad = [m for m in metrics if m not in METRIC_NAMES]
    if bad:
        raise ValueError(f"Unknown metric(s) {bad}; use {sorted(METRIC_NAMES)}.")
    short = sorted(name for name, hs in runs.items() if len(hs) < 2)
    if short:
        raise ValueError(f"format_over_seeds needs the runs of at least two seeds per method; {short} have fewer.")
    w = max([12, *(len(name) + 2 for name in runs)])
    seeds = {len(hs) for hs in runs.values()}
    head = f"{'strategy':<{w}}" + "".join(f"{m:>16}" for m in metrics)
    title = f"final round, mean ± 95 % half-width (t-interval) over {'/'.join(map(str, sorted(seeds)))} seeds"
    lines = [title, head, "-" * len(head)]
    for name, hs in runs.items():
        finals = [h.metrics() for h in hs]
        cells = [t_interval([f[m] for f in finals]) for m in metrics]
        lines.append(f"{name:<{w}}" + "".join(f"{mu:>9.3f} ± {h:.3f}" for mu, h in cells))
    return "\n".join(lines)

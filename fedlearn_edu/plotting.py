"""Figures of simulation results (the partition figure lives in :mod:`fedlearn_edu.data`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .history import History
from .metrics import METRIC_NAMES

__all__ = ["plot_curves", "plot_client_accuracy"]


def _as_dict(histories) -> dict[str, History]:
    if isinstance(histories, History):
        return {histories.strategy: histories}
    if isinstance(histories, Mapping):
        return dict(histories)
    return {h.strategy: h for h in histories}


def plot_curves(histories, metrics: Sequence[str] = ("mean", "worst10"), axes=None):
    """Fairness metrics over rounds, one panel per metric, one line per run.

    Args:
        histories: a :class:`History`, a list of them, or ``{label: History}``.
        metrics: names among ``mean``, ``std``, ``worst10``, ``best10``.
        axes: matplotlib axes, one per metric (created when ``None``).

    Returns:
        The array of axes.
    """
    import matplotlib.pyplot as plt

    runs = _as_dict(histories)
    for m in metrics:
        if m not in METRIC_NAMES:
            raise ValueError(f"Unknown metric {m!r}; choose from {sorted(METRIC_NAMES)}.")
    if axes is None:
        _, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.2), squeeze=False)
        axes = axes[0]
    for ax, metric in zip(np.atleast_1d(axes), metrics):
        for label, h in runs.items():
            ax.plot(h.eval_rounds, h.curve(metric), label=label)
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy" if metric != "std" else "std of accuracy")
        ax.set_title(METRIC_NAMES[metric])
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize="small")
    return axes


def plot_client_accuracy(histories, index: int = -1, ax=None):
    """Distribution of per-client accuracy of the global model (one box + points per run).

    Args:
        histories: a :class:`History`, a list of them, or ``{label: History}``.
        index: which evaluation (default: the last).
        ax: the matplotlib ``Axes`` to draw on (default: a new figure).

    Returns:
        The ``Axes``.
    """
    import matplotlib.pyplot as plt

    runs = _as_dict(histories)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.3 * len(runs), 3.2))
    data = [h.client_accuracy[index][~np.isnan(h.client_accuracy[index])] for h in runs.values()]
    ax.boxplot(data, showfliers=False)
    rng = np.random.default_rng(0)
    for i, d in enumerate(data, start=1):
        ax.scatter(i + rng.uniform(-0.15, 0.15, d.size), d, s=10, alpha=0.6)
    ax.set_xticks(range(1, len(runs) + 1), list(runs))
    ax.set_ylabel("accuracy on the client's test split")
    ax.grid(alpha=0.3, axis="y")
    return ax

"""Fairness metrics over clients (METHODS.md, "Common ground")."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fairness_metrics", "METRIC_NAMES"]

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

"""Pictures of a partition: which client holds how many samples of which class."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["plot_partition"]

_KINDS = ("bubble", "bar", "heatmap")


def _counts_of(federation_or_counts: Any, split: str) -> tuple[np.ndarray, str]:
    if hasattr(federation_or_counts, "label_counts"):
        fed = federation_or_counts
        return np.asarray(fed.label_counts(split)), getattr(fed, "name", "")
    counts = np.asarray(federation_or_counts)
    if counts.ndim != 2 or counts.size == 0:
        raise ValueError(
            f"Expected a Federation or a counts array of shape (num_clients, num_classes); got shape {counts.shape}."
        )
    if counts.dtype.kind not in "iuf" or not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("Counts must be finite and non-negative.")
    return counts, ""


def plot_partition(
    federation_or_counts: Any,
    ax=None,
    kind: str = "bubble",
    split: str = "train",
    class_names: Sequence[str] | None = None,
    title: str | None = None,
):
    """Draw a clients x classes table of sample counts.

    Args:
        federation_or_counts: A :class:`~fedlearn_edu.data.Federation` (its ``label_counts(split)`` is drawn)
            or the counts themselves, e.g. from :func:`~fedlearn_edu.data.partition_label_counts`.
        ax: Where to draw; a new figure is made if omitted.
        kind: ``"bubble"``: a dot at (client, class) with area proportional to the count (the usual picture
            of Dirichlet skew). ``"bar"``: one horizontal stacked bar per client, coloured by class, so
            client sizes show too. ``"heatmap"``: counts as colours. (default "bubble")
        split: Which local split to count (Federation input only). (default "train")
        class_names: Legend / tick labels of the classes.
        title: Defaults to the Federation's ``name``.

    Returns:
        ax (matplotlib.axes.Axes)

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> ax = plot_partition(np.array([[5, 0], [1, 4]]), kind="bar")
        >>> ax.get_ylabel()
        'client'
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}; got {kind!r}.")
    counts, default_title = _counts_of(federation_or_counts, split)
    num_clients, num_classes = counts.shape
    names = [str(c) for c in (class_names if class_names is not None else range(num_classes))]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for {num_classes} classes.")

    import matplotlib.pyplot as plt

    if ax is None:
        width = min(max(5.0, 0.18 * num_clients + 2.0), 16.0) if kind != "bar" else 7.0
        height = 4.0 if kind != "bar" else min(max(3.0, 0.22 * num_clients + 1.0), 16.0)
        _, ax = plt.subplots(figsize=(width, height))
    clients = np.arange(num_clients)
    cmap = plt.get_cmap("tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "viridis")
    colours = [cmap(c % cmap.N) if num_classes <= 20 else cmap(c / max(num_classes - 1, 1)) for c in range(num_classes)]

    if kind == "bubble":
        cc, kk = np.meshgrid(clients, np.arange(num_classes), indexing="ij")
        top = counts.max() if counts.max() > 0 else 1
        area = 300.0 * counts / top
        mask = counts > 0
        ax.scatter(cc[mask], kk[mask], s=area[mask], c=[colours[k] for k in kk[mask]], alpha=0.8, edgecolors="none")
        ax.set_xlabel("client")
        ax.set_ylabel("class")
        ax.set_yticks(np.arange(num_classes))
        if num_classes <= 20:
            ax.set_yticklabels(names)
        ax.set_xlim(-0.7, num_clients - 0.3)
        ax.set_ylim(-0.7, num_classes - 0.3)
    elif kind == "bar":
        left = np.zeros(num_clients)
        for k in range(num_classes):
            ax.barh(
                clients,
                counts[:, k],
                left=left,
                color=colours[k],
                height=0.8,
                label=names[k] if num_classes <= 20 else None,
            )
            left += counts[:, k]
        ax.set_xlabel("samples")
        ax.set_ylabel("client")
        ax.set_ylim(num_clients - 0.5, -0.5)  # client 0 on top
        if num_classes <= 20:
            ax.legend(title="class", bbox_to_anchor=(1.01, 1.0), loc="upper left", fontsize="small")
    else:
        im = ax.imshow(counts.T, aspect="auto", origin="lower", cmap="Blues", interpolation="nearest")
        ax.figure.colorbar(im, ax=ax, label="samples")
        ax.set_xlabel("client")
        ax.set_ylabel("class")
        if num_classes <= 20:
            ax.set_yticks(np.arange(num_classes))
            ax.set_yticklabels(names)
    ax.set_title(default_title if title is None else title)
    return ax

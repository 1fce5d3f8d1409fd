"""Partition plots (:mod:`fedlearn_edu.data.plotting`): an Axes for every kind."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from fedlearn_edu.data import federated_dataset, plot_partition


# --------------------------------------------------------------------------- #
# plotting
# --------------------------------------------------------------------------- #
def test_plot_partition_returns_axes_for_every_kind():
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes

    fed = federated_dataset("digits", "dirichlet", num_clients=8, alpha=0.3, seed=0)
    for kind in ("bubble", "bar", "heatmap"):
        ax = plot_partition(fed, kind=kind)
        assert isinstance(ax, Axes)
        assert ax.get_title() == fed.name
        plt.close(ax.figure)
    counts = fed.label_counts("train")
    ax = plot_partition(counts, kind="bar", class_names=[f"c{i}" for i in range(10)])
    # the stacked bars of client i add up to its number of training samples
    widths = np.zeros(8)
    for patch in ax.patches:
        widths[int(round(patch.get_y() + patch.get_height() / 2))] += patch.get_width()
    np.testing.assert_allclose(widths, counts.sum(1))
    plt.close(ax.figure)
    fig, ax0 = plt.subplots()
    assert plot_partition(counts, ax=ax0) is ax0
    plt.close(fig)
    with pytest.raises(ValueError):
        plot_partition(counts, kind="pie")
    with pytest.raises(ValueError):
        plot_partition(np.zeros(5))

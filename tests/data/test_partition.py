"""The partitions (:mod:`fedlearn_edu.data.partition`): quantity skew keeps a partition at any sigma."""

import numpy as np

from fedlearn_edu.data import quantity_skew_partition


def test_quantity_skew_with_huge_sigma_keeps_min_size_and_a_partition():
    parts = quantity_skew_partition(1000, 10, sigma=1000.0, min_size=10, seed=0)
    allidx = np.concatenate(parts)
    assert min(len(p) for p in parts) >= 10
    assert np.array_equal(np.sort(allidx), np.arange(1000))

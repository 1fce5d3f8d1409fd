"""The label noise (:mod:`fedlearn_edu.data.noise`): flips go to other classes, train labels only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlearn_edu.data import add_label_noise, flip_labels, make_federation


# --------------------------------------------------------------------------- #
# label noise
# --------------------------------------------------------------------------- #
def test_flip_labels_flips_exactly_to_other_classes():
    y = np.repeat(np.arange(4), 2500)
    noisy, mask = flip_labels(y, 0.4, num_classes=4, seed=0, return_mask=True)
    assert mask.sum() == 4000
    assert np.all(noisy[mask] != y[mask]) and np.array_equal(noisy[~mask], y[~mask])
    # uniform over the 3 other classes: each offset (1, 2, 3) about a third
    offsets = np.bincount((noisy[mask] - y[mask]) % 4, minlength=4)[1:]
    assert np.all(np.abs(offsets / 4000 - 1 / 3) < 0.05)
    assert np.array_equal(y, np.repeat(np.arange(4), 2500)), "input must not be modified"
    t = flip_labels(torch.as_tensor(y), 0.1, 4, seed=1)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and int((t != torch.as_tensor(y)).sum()) == 1000
    with pytest.raises(ValueError):
        flip_labels(y, 1.5, 4)
    with pytest.raises(ValueError):
        flip_labels(y, 0.1, 1)
    with pytest.raises(ValueError):
        flip_labels(y, 0.1, 3)  # label 3 >= num_classes


def test_add_label_noise_marks_and_flips_train_only():
    x, y = torch.rand(400, 1, 8, 8), torch.arange(400) % 10
    fed = make_federation(x, y, np.array_split(np.arange(400), 8), seed=0)
    noisy = add_label_noise(fed, noisy_clients=3, fraction=0.5, seed=0)
    flags = [c.info["noisy"] for c in noisy]
    assert sum(flags) == 3
    for c0, c1 in zip(fed, noisy):
        assert torch.equal(c0.test_y, c1.test_y)
        changed = int((c0.train_y != c1.train_y).sum())
        assert changed == c1.info["num_flipped"] == (round(0.5 * c0.num_train) if c1.info["noisy"] else 0)
    chosen = add_label_noise(fed, [0, 7], 0.2)
    assert [c.info["noisy"] for c in chosen] == [True] + [False] * 6 + [True]
    with pytest.raises(ValueError):
        add_label_noise(fed, 9, 0.2)

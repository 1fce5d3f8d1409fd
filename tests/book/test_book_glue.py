"""Glued values are stored as plain Python values the book's formatter can read back."""

import ast

import numpy as np
import pytest
import torch

from fedlearn_edu.book import plain


@pytest.mark.parametrize(
    "value, expected",
    [
        (np.float64(0.906), 0.906),
        (np.float32(0.5), 0.5),
        (np.int64(7), 7),
        (torch.tensor(0.25, dtype=torch.float64), 0.25),
        (np.array([3.5]), 3.5),
        (2, 2),
        ("FedAvg", "FedAvg"),
    ],
)
def test_plain_values_round_trip_through_their_repr(value, expected):
    out = plain(value)
    assert type(out) in (float, int, str)
    assert ast.literal_eval(repr(out)) == pytest.approx(expected) if not isinstance(expected, str) else out == expected


def test_numpy_scalars_would_not_round_trip_without_it():
    assert "np.float64" in repr(np.float64(0.5)) or repr(np.float64(0.5)) == "0.5"  # NumPy >= 2 prints the type


def test_plain_rejects_arrays_and_objects():
    with pytest.raises(TypeError, match="one number at a time"):
        plain(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="one number at a time"):
        plain(torch.zeros(3))
    with pytest.raises(TypeError, match="number or a string"):
        plain([1.0])

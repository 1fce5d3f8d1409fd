"""Clients and federations (:mod:`fedlearn_edu.data.federation`): bad partitions, labels and inputs are
refused by name."""

import math

import numpy as np
import pytest
import torch

from fedlearn_edu.data import ClientData, Federation, make_federation


@pytest.mark.parametrize(
    "parts, match",
    [
        ([np.arange(0, 12), np.arange(8, 20)], "overlap"),
        ([np.arange(0, 10).astype(float), np.arange(10, 20)], "integer"),
    ],
    ids=["overlapping", "non-integer"],
)
def test_make_federation_refuses_bad_partitions(parts, match):
    x, y = torch.rand(20, 1, 4, 4), torch.arange(20) % 2
    with pytest.raises((ValueError, TypeError), match=match):
        make_federation(x, y, parts)


def test_make_federation_refuses_bad_labels_and_inputs():
    parts = [np.arange(0, 10), np.arange(10, 20)]
    x, y = torch.rand(20, 1, 4, 4), torch.arange(20) % 2
    with pytest.raises(ValueError, match="integer"):
        make_federation(x, y.double() + 0.5, parts)
    with pytest.raises(ValueError, match="outside"):
        make_federation(x, y, parts, num_classes=1)
    with pytest.raises(ValueError, match=">= 0"):
        make_federation(x, y - 1, parts)
    bad = x.clone()
    bad[3, 0, 0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        make_federation(bad, y, parts)
    with pytest.raises(ValueError, match="labels"):
        make_federation(x, y[:19], parts)


def test_client_data_and_federation_check_their_tensors():
    x, y = torch.rand(10, 3), torch.arange(10) % 2
    with pytest.raises(ValueError, match="one label per input"):
        ClientData(x, y[:9], x[:2], y[:2])
    with pytest.raises(TypeError, match="integer"):
        ClientData(x, y.float(), x[:2], y[:2])
    bad = x.clone()
    bad[0, 0] = math.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        ClientData(bad, y, x[:2], y[:2])
    ok = ClientData(x, y, x[:2], y[:2])
    with pytest.raises(ValueError, match="outside"):
        Federation([ok], num_classes=1)
    with pytest.raises(TypeError, match="num_classes"):
        Federation([ok], num_classes=2.5)

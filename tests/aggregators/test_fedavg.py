"""FedAvg's weighted mean and the conflict count (:mod:`fedlearn_edu.aggregators.fedavg`): against NumPy,
on dicts of layers, and the errors for bad updates and weights."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu import aggregators
from fedlearn_edu.aggregators import count_conflicts, fedavg
from fedlearn_edu.params import flatten_params

finite = st.floats(-1e3, 1e3, allow_nan=False, width=64)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), d=st.integers(1, 9), data=st.data())
def test_fedavg_equals_numpy_weighted_mean(m, d, data):
    deltas = data.draw(arrays(np.float64, (m, d), elements=finite))
    w = data.draw(arrays(np.float64, (m,), elements=st.floats(0.01, 100)))
    expected = np.average(deltas, axis=0, weights=w)
    got = aggregators.fedavg(torch.tensor(deltas), torch.tensor(w))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-9)


def test_fedavg_dict_equals_flat_and_is_scale_invariant_in_weights():
    g = torch.Generator().manual_seed(0)
    deltas = {"a.weight": torch.randn(4, 3, 2, generator=g), "a.bias": torch.randn(4, 3, generator=g)}
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = aggregators.fedavg(deltas, w)
    flat = aggregators.fedavg(flatten_params(deltas, stacked=True), w * 10)
    torch.testing.assert_close(flatten_params(out), flat)
    # weights summing to 1: the aggregate of identical updates is that update
    same = torch.ones(5, 3)
    torch.testing.assert_close(aggregators.fedavg(same, torch.rand(5) + 0.1), torch.ones(3))


@pytest.mark.parametrize(
    "bad, msg",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 0.0]]), "row 0 of"),
        (torch.tensor([[1.0, 0.0], [float("inf"), 0.0]]), "row 1 of"),
        (torch.zeros(0, 3), "m = 0"),
        (torch.zeros(3), "Tensor\\[m, d\\]"),
    ],
)
def test_fedavg_rejects_bad_updates(bad, msg):
    with pytest.raises(ValueError, match=msg):
        aggregators.fedavg(bad, torch.ones(max(bad.shape[0], 1)) if bad.dim() == 2 else torch.ones(3))


@pytest.mark.parametrize(
    "w, msg",
    [
        (torch.tensor([1.0, -1.0]), ">= 0"),
        (torch.tensor([0.0, 0.0]), "sum to zero"),
        (torch.tensor([1.0]), "m = 2"),
        (torch.tensor([1.0, float("nan")]), "NaN"),
    ],
)
def test_fedavg_rejects_bad_weights(w, msg):
    with pytest.raises(ValueError, match=msg):
        aggregators.fedavg(torch.ones(2, 3), w)


def test_count_conflicts_whole_and_per_layer():
    deltas = {
        "l1.weight": torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]),
        "l2.weight": torch.tensor([[1.0], [5.0], [-1.0]]),
    }
    update = {"l1.weight": torch.tensor([1.0, 0.0]), "l2.weight": torch.tensor([1.0])}
    out = aggregators.count_conflicts(deltas, update)
    # dots: l1 = [1, -1, 0]; l2 = [1, 5, -1]; total = [2, 4, -1]
    assert out == {"conflicts": 1, "conflicts_per_layer": {"l1": 1, "l2": 1}}
    flat = aggregators.count_conflicts(torch.tensor([[1.0, 1.0], [-3.0, 1.0]]), torch.tensor([1.0, 1.0]))
    assert flat["conflicts"] == 1


def test_fedavg_refuses_integer_updates():
    with pytest.raises(TypeError, match="deltas.*floating"):
        fedavg(torch.tensor([[1, 2], [3, 4]]), torch.tensor([1.0, 1.0]))


def test_fedavg_weights_near_float_max_do_not_overflow():
    big = torch.finfo(torch.float32).max / 2
    d = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out = fedavg(d, torch.tensor([big, big, big]))
    torch.testing.assert_close(out, torch.tensor([2 / 3, 2 / 3]))


def test_count_conflicts_refuses_nan_in_the_update():
    d = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    with pytest.raises(ValueError, match="update"):
        count_conflicts(d, torch.tensor([math.nan, 1.0]))

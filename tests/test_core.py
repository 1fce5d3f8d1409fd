"""Parameters layout, aggregation math, metrics, models."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu import aggregators
from fedlearn_edu.metrics import fairness_metrics
from fedlearn_edu.models import MODELS, count_parameters, make_model
from fedlearn_edu.params import flatten_params, layer_groups, stack_params, unstack_params
from fedlearn_edu.utils import derive_seed, resolve_device

finite = st.floats(-1e3, 1e3, allow_nan=False, width=64)


# ---------------------------------------------------------------- params
def test_stack_unstack_flatten_roundtrip():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(7,))
    ps = [{k: torch.randn_like(v) for k, v in model.named_parameters()} for _ in range(3)]
    stacked = stack_params(ps)
    assert {k: v.shape[0] for k, v in stacked.items()} == {k: 3 for k in stacked}
    for a, b in zip(ps, unstack_params(stacked)):
        for k in a:
            assert torch.equal(a[k], b[k])
    flat = flatten_params(stacked, stacked=True)
    assert flat.shape == (3, count_parameters(model))
    for i, p in enumerate(ps):  # row i: client i's tensors, raveled in the dict's order
        np.testing.assert_array_equal(flat[i].numpy(), np.concatenate([p[k].numpy().ravel() for k in p]))
    assert torch.equal(flatten_params(ps[1]), flat[1])


def test_layer_groups_put_weight_and_bias_together():
    names = [n for n, _ in make_model("cnn", (1, 8, 8), 10).named_parameters()]
    groups = layer_groups(names)
    assert groups["conv1"] == ["conv1.weight", "conv1.bias"]
    assert sum(len(v) for v in groups.values()) == len(names)


# ---------------------------------------------------------------- fedavg
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


# ---------------------------------------------------------------- metrics
@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, st.integers(1, 60), elements=st.floats(0, 1)))
def test_fairness_metrics_against_direct_computation(acc):
    out = fairness_metrics(acc)
    k = max(1, int(0.1 * acc.size))
    s = sorted(acc)
    assert math.isclose(out["mean"], float(np.mean(acc)), abs_tol=1e-12)
    assert math.isclose(out["std"], float(np.std(acc)), abs_tol=1e-12)
    assert math.isclose(out["worst10"], sum(s[:k]) / k, abs_tol=1e-12)
    assert math.isclose(out["best10"], sum(s[-k:]) / k, abs_tol=1e-12)
    assert out["worst10"] <= out["mean"] + 1e-12 <= out["best10"] + 2e-12


def test_fairness_metrics_ignores_nan_and_rejects_empty():
    assert fairness_metrics([0.5, float("nan"), 1.0])["mean"] == 0.75
    with pytest.raises(ValueError):
        fairness_metrics([float("nan")])


# ---------------------------------------------------------------- models
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_models_shapes_features_and_no_batchnorm(name, shape):
    model = make_model(name, shape, 10, seed=1)
    x = torch.rand(4, *shape)
    assert model(x).shape == (4, 10)
    feats = model(x, features=True)
    assert feats.dim() == 2 and feats.shape[0] == 4
    assert not any(isinstance(m, torch.nn.modules.batchnorm._NormBase) for m in model.modules())
    assert len(list(model.buffers())) == 0
    again = make_model(name, shape, 10, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_model_sizes_match_the_papers():
    # SmallCNN's OUI layer is FC(4096 -> 128) on CIFAR-sized inputs.
    assert make_model("smallcnn", (3, 32, 32), 10).fc1.in_features == 4096
    # ResNet-20: 3 stages x 3 blocks x 2 convs + stem conv + fc = 20 weighted layers.
    r = make_model("resnet20", (3, 32, 32), 10)
    convs = [m for m in r.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) + 1 == 20
    assert 0.26e6 < count_parameters(r) < 0.28e6
    assert make_model("mlp", (1, 28, 28), 10).hidden[0].out_features == 200


def test_make_model_errors():
    with pytest.raises(ValueError, match="Unknown model"):
        make_model("vgg", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="image inputs"):
        make_model("cnn", (60,), 10)
    with pytest.raises(ValueError, match="6n\\+2"):
        make_model("resnet20", (3, 32, 32), 10, depth=21)


# ---------------------------------------------------------------- utils
def test_resolve_device_and_derive_seed():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in {"cpu", "cuda", "mps"}
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert len({derive_seed(0, t, i) for t in range(10) for i in range(10)}) == 100

"""FedOUI's client signal (:mod:`fedlearn_edu.signals.oui`): the OUI against NumPy, its pairwise form, the
penultimate pre-activations of every model, the fixed probe, vmap over clients.

The Beta fit, the weights and FedAlign (the aggregation math) are tested in
tests/aggregators/test_fedoui.py.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu.models import make_model
from fedlearn_edu.params import get_params, stack_params
from fedlearn_edu.signals import (
    activation_counts,
    client_oui,
    hamming_distances,
    oui,
    oui_pairwise,
    penultimate_preactivations,
    probe_batch,
    probe_indices,
)

FAST = settings(max_examples=40, deadline=None)
# Pre-activations: a mix of signs and exact zeros (zero counts as "off": Z > 0 is the test).
preact = st.sampled_from([-2.0, -0.5, 0.0, 0.3, 1.5])


def np_oui(z: np.ndarray) -> float:
    """Independent NumPy OUI: loop over units."""
    b, d = z.shape
    vals = []
    for j in range(d):
        s = int(np.count_nonzero(z[:, j] > 0))
        vals.append(min(s, b - s) / (b // 2))
    return float(np.clip(np.mean(vals), 0, 1))


def np_pair_distances(z: np.ndarray) -> list[int]:
    a = z > 0
    return [int(np.count_nonzero(a[i] != a[k])) for i, k in itertools.combinations(range(len(a)), 2)]


@pytest.mark.parametrize("b", [2, 3, 8, 31, 32])
def test_oui_is_one_when_every_unit_splits_the_batch_in_half(b):
    d = 6
    z = torch.full((b, d), -1.0)
    for j in range(d):  # a different half for every unit
        on = torch.randperm(b, generator=torch.Generator().manual_seed(j))[: b // 2 + (j % 2) * (b % 2)]
        z[on, j] = 1.0
    assert oui(z) == 1.0


def test_oui_is_zero_for_constant_patterns():
    b, d = 10, 5
    assert oui(torch.ones(b, d)) == 0.0  # always on
    assert oui(-torch.ones(b, d)) == 0.0  # always off
    assert oui(torch.zeros(b, d)) == 0.0  # 0 is "off"
    mixed = torch.cat([torch.ones(b, 2), -torch.ones(b, 3)], dim=1)
    assert oui(mixed) == 0.0
    assert oui_pairwise(mixed) == 0.0


@FAST
@given(b=st.integers(2, 12), d=st.integers(1, 8), data=st.data())
def test_oui_equals_numpy_and_is_invariant(b, d, data):
    z = data.draw(arrays(np.float64, (b, d), elements=preact))
    t = torch.tensor(z)
    assert oui(t) == pytest.approx(np_oui(z), abs=1e-12)
    assert 0.0 <= oui(t) <= 1.0
    # permuting samples or units, or flipping a unit's on/off (negating a column with no zeros)
    perm_b, perm_d = np.random.default_rng(b * 31 + d).permutation(b), np.random.default_rng(d).permutation(d)
    assert oui(t[perm_b][:, perm_d]) == pytest.approx(oui(t), abs=1e-12)
    nz = np.where(z == 0, 1.0, z)
    flipped = nz.copy()
    flipped[:, 0] *= -1
    assert oui(torch.tensor(flipped)) == pytest.approx(np_oui(nz), abs=1e-12)


@FAST
@given(b=st.integers(2, 12), d=st.integers(2, 8), data=st.data())
def test_pair_identity_and_pairwise_form(b, d, data):
    """sum over pairs of Hamming distances = sum_j s_j (B - s_j); oui_pairwise matches NumPy."""
    z = data.draw(arrays(np.float64, (b, d), elements=preact))
    t = torch.tensor(z)
    dist = np_pair_distances(z)
    s = activation_counts(t)
    assert torch.equal(s, torch.tensor((z > 0).sum(axis=0)))
    h = hamming_distances(t)
    assert torch.equal(h, h.T) and bool((h.diagonal() == 0).all())
    iu = np.triu_indices(b, 1)
    assert h.numpy()[iu].tolist() == dist
    assert sum(dist) == int((s * (b - s)).sum())  # the identity
    half = d // 2
    assert oui_pairwise(t) == pytest.approx(np.mean(np.minimum(dist, half)) / half, abs=1e-12)
    assert oui_pairwise(t, clamp=False) * half * math.comb(b, 2) == pytest.approx(sum(dist), abs=1e-9)


@FAST
@given(b=st.integers(2, 12), d=st.integers(1, 8), data=st.data())
def test_normalised_pair_distance_is_bracketed_by_oui(b, d, data):
    """P = sum_pairs H / (d floor(B/2) ceil(B/2)) satisfies OUI <= P <= OUI + c_B OUI (1 - OUI)."""
    z = torch.tensor(data.draw(arrays(np.float64, (b, d), elements=preact)))
    o = oui(z)
    p = float(torch.triu(hamming_distances(z), 1).sum()) / (d * (b // 2) * ((b + 1) // 2))
    c = 1.0 if b % 2 == 0 else (b - 1) / (b + 1)
    assert o - 1e-12 <= p <= o + c * o * (1 - o) + 1e-12


def test_oui_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match=r"Tensor\[B, d\]"):
        oui(torch.ones(5))
    with pytest.raises(ValueError, match=r"Tensor\[B, d\]"):
        oui(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="at least B = 2"):
        oui(torch.ones(1, 4))
    z = torch.randn(4, 3)
    z[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf.*sample 2"):
        oui(z)
    with pytest.raises(TypeError, match="torch.Tensor"):
        oui(np.ones((4, 3)))
    with pytest.raises(ValueError, match="d >= 2"):
        oui_pairwise(torch.randn(4, 1))
    with pytest.raises(ValueError, match="at least B = 2"):
        hamming_distances(torch.randn(1, 3))


@pytest.mark.parametrize("name", ["mlp", "cnn", "smallcnn", "resnet20"])
def test_penultimate_preactivations_per_model(name):
    torch.manual_seed(0)
    model = make_model(name, (1, 8, 8), 10, **({"hidden": (12, 9)} if name == "mlp" else {}))
    model.train()
    x = torch.randn(6, 1, 8, 8)
    z = penultimate_preactivations(model, x)
    assert model.training  # mode restored
    with torch.no_grad():
        if name == "mlp":
            expected = model.hidden[1](torch.relu(model.hidden[0](x.flatten(1))))
        elif name == "cnn":
            h = torch.nn.functional.max_pool2d(torch.relu(model.conv1(x)), 2)
            h = torch.nn.functional.max_pool2d(torch.relu(model.conv2(h)), 2)
            expected = model.fc2(torch.relu(model.fc1(h.flatten(1))))
        elif name == "smallcnn":
            h = torch.nn.functional.max_pool2d(torch.relu(model.conv1(x)), 2)
            h = torch.nn.functional.max_pool2d(torch.relu(model.conv2(h)), 2)
            expected = model.fc1(h.flatten(1))
        else:
            expected = None
    if expected is not None:
        torch.testing.assert_close(z, expected)
        # the logits are the last Linear of the ReLU of these pre-activations
        torch.testing.assert_close(model.out(torch.relu(z)), model(x).detach())
    else:  # ResNet20: pooled post-ReLU features
        assert z.shape == (6, 64) and bool((z >= 0).all())
        torch.testing.assert_close(model.out(z), model(x).detach())


def test_hook_capture_equals_feature_method_and_functional_params():
    model = make_model("smallcnn", (1, 8, 8), 10, seed=1)
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(penultimate_preactivations(model, x, layer="fc1"), penultimate_preactivations(model, x))
    other = {k: v + 0.1 for k, v in get_params(model).items()}
    z_fc = penultimate_preactivations(model, x, params=other)
    z_hook = penultimate_preactivations(model, x, params=other, layer="fc1")
    torch.testing.assert_close(z_fc, z_hook)
    assert not torch.allclose(z_fc, penultimate_preactivations(model, x))
    with pytest.raises(ValueError, match="layer=.nope. names no submodule"):
        penultimate_preactivations(model, x, layer="nope")


def test_model_without_features_argument_gets_a_clear_error():
    plain = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    x = torch.randn(4, 1, 8, 8)
    with pytest.raises(TypeError, match="layer="):
        penultimate_preactivations(plain, x)
    z = penultimate_preactivations(plain, x, layer="1")
    torch.testing.assert_close(z, plain[1](x.flatten(1)))
    stacked = stack_params([get_params(plain)] * 2)
    o = client_oui(plain, stacked, torch.stack([x, x]), layer="1")
    assert o.tolist() == pytest.approx([oui(z)] * 2)


def test_client_oui_vmap_equals_one_client_at_a_time():
    model = make_model("mlp", (1, 8, 8), 10, seed=0, hidden=(20, 16))
    g = torch.Generator().manual_seed(0)
    clients = [{k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in get_params(model).items()} for _ in range(4)]
    probes = torch.randn(4, 32, 1, 8, 8, generator=g)
    got = client_oui(model, stack_params(clients), probes)
    expected = [oui(penultimate_preactivations(model, probes[i], clients[i])) for i in range(4)]
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="3 probes"):
        client_oui(model, stack_params(clients), probes[:3])


def test_probe_is_fixed_own_data_and_full_size():
    a, b = probe_indices(100, 32, seed=0), probe_indices(100, 32, seed=0)
    assert torch.equal(a, b) and a.unique().numel() == 32 and int(a.max()) < 100
    assert not torch.equal(a, probe_indices(100, 32, seed=1))
    small = probe_indices(10, 32, seed=0)  # fewer samples than B: drawn with replacement
    assert small.numel() == 32 and int(small.max()) < 10
    x = torch.arange(50.0).reshape(50, 1)
    assert torch.equal(probe_batch(x, 8, 3), x[probe_indices(50, 8, 3)])
    with pytest.raises(ValueError, match="probe_size"):
        probe_indices(10, 1)

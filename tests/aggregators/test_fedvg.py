"""FedVG: weights (aggregators), validation sets.

The validation-gradient norms (the signal) are tested in tests/signals/test_validation_gradients.py.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu import federated_dataset
from fedlearn_edu.aggregators import (
    fedavg,
    fedvg_aggregate,
    fedvg_layerwise_weights,
    fedvg_mixed_weights,
    fedvg_weights,
)
from fedlearn_edu.data import external_validation_set, resize_images, server_validation_split

norm_values = st.floats(0.0, 1e3, allow_nan=False, width=64)


# ---------------------------------------------------------------- weights (pure math)
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 7), L=st.integers(1, 5), data=st.data())
def test_clientwise_weights_sum_to_one_positive_and_inverse_to_G(m, L, data):
    norms = data.draw(arrays(np.float64, (m, L), elements=norm_values))
    eps = 1e-8
    s = fedvg_weights(torch.tensor(norms), eps).numpy()
    G = norms.sum(axis=1)
    inv = 1.0 / (G + eps)
    np.testing.assert_allclose(s, inv / inv.sum(), rtol=1e-10)
    assert np.all(s > 0)
    assert s.sum() == pytest.approx(1.0, abs=1e-12)
    # inversely proportional: s_k (G_k + eps) is the same for every client
    prod = s * (G + eps)
    np.testing.assert_allclose(prod, np.full(m, prod[0]), rtol=1e-9)
    # a 1-D input is G itself
    np.testing.assert_allclose(fedvg_weights(torch.tensor(G), eps).numpy(), s, rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 7), L=st.integers(1, 5), data=st.data())
def test_layerwise_weights_equal_numpy_and_columns_sum_to_one(m, L, data):
    norms = data.draw(arrays(np.float64, (m, L), elements=norm_values))
    s = fedvg_layerwise_weights(torch.tensor(norms), 1e-8).numpy()
    inv = 1.0 / (norms + 1e-8)
    np.testing.assert_allclose(s, inv / inv.sum(axis=0, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(s.sum(axis=0), np.ones(L), rtol=1e-12)
    assert np.all(s > 0)


@pytest.mark.parametrize("value", [0.0, 1e-9, 3.7, 1e4])
def test_equal_norms_give_uniform_weights(value):
    norms = torch.full((5, 3), value, dtype=torch.float64)
    torch.testing.assert_close(fedvg_weights(norms), torch.full((5,), 0.2, dtype=torch.float64))
    torch.testing.assert_close(fedvg_layerwise_weights(norms), torch.full((5, 3), 0.2, dtype=torch.float64))


def test_smaller_gradient_gets_larger_weight_and_eps_matters_only_near_zero():
    s = fedvg_weights(torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64))
    torch.testing.assert_close(s, torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64) / 7)
    s0 = fedvg_weights(torch.tensor([[0.0], [1.0]], dtype=torch.float64), eps=1e-8)
    assert float(s0[0]) > 1 - 1e-7  # a zero-gradient client takes (almost) all the weight


def test_mixed_weights_equal_the_authors_formula():
    s = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    n = torch.tensor([10, 30, 60])
    expected = (s.numpy() + n.numpy() / n.numpy().sum()) / 2
    np.testing.assert_allclose(fedvg_mixed_weights(s, n).numpy(), expected, rtol=1e-12)
    layer = torch.tensor([[0.5, 0.1], [0.3, 0.1], [0.2, 0.8]], dtype=torch.float64)
    got = fedvg_mixed_weights(layer, n).numpy()
    np.testing.assert_allclose(got, (layer.numpy() + (n.numpy() / 100)[:, None]) / 2, rtol=1e-12)
    np.testing.assert_allclose(got.sum(axis=0), [1.0, 1.0], rtol=1e-12)


def test_aggregate_clientwise_is_fedavg_and_layerwise_is_per_tensor():
    g = torch.Generator().manual_seed(0)
    deltas = {
        "a.weight": torch.randn(3, 4, 2, generator=g, dtype=torch.float64),
        "a.bias": torch.randn(3, 4, generator=g, dtype=torch.float64),
    }
    s = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    got = fedvg_aggregate(deltas, s)
    ref = fedavg(deltas, s)
    for k in deltas:
        torch.testing.assert_close(got[k], ref[k])
    W = torch.tensor([[0.2, 0.6], [0.5, 0.1], [0.3, 0.3]], dtype=torch.float64)
    got = fedvg_aggregate(deltas, W)
    for j, k in enumerate(deltas):
        expected = np.einsum("k,k...->...", W[:, j].numpy(), deltas[k].numpy())
        np.testing.assert_allclose(got[k].numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match=r"\[3, 2\]"):
        fedvg_aggregate(deltas, torch.ones(3, 5) / 3)


def test_weight_errors_are_clear():
    with pytest.raises(ValueError, match="client 1"):
        fedvg_weights(torch.tensor([[1.0, 2.0], [float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="client 0"):
        fedvg_layerwise_weights(torch.tensor([[float("inf")], [1.0]]))
    with pytest.raises(ValueError, match="negative"):
        fedvg_weights(torch.tensor([[1.0], [-2.0]]))
    with pytest.raises(ValueError, match="m = 0"):
        fedvg_weights(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="eps"):
        fedvg_weights(torch.ones(2, 2), eps=0)
    with pytest.raises(ValueError, match="Tensor\\[m, L\\]"):
        fedvg_layerwise_weights(torch.ones(3))
    with pytest.raises(ValueError, match="num_samples"):
        fedvg_mixed_weights(torch.tensor([0.5, 0.5]), torch.tensor([1, 2, 3]))


# ---------------------------------------------------------------- validation sets
def test_server_validation_split_moves_samples_without_loss():
    fed = federated_dataset("digits", num_clients=5, alpha=1.0, seed=0)
    clients, (xv, yv) = server_validation_split(fed, fraction=0.1, seed=3)
    for before, after in zip(fed, clients):
        k = after.info["num_val"]
        assert k == max(1, round(0.1 * before.num_train))
        assert after.num_train == before.num_train - k
        assert torch.equal(after.test_y, before.test_y)
    assert yv.shape[0] == sum(c.info["num_val"] for c in clients)

    # every training sample ends up exactly once on a client or at the server
    def rows(x):
        return sorted(map(tuple, x.reshape(x.shape[0], -1).tolist()))

    assert rows(torch.cat([c.train_x for c in clients] + [xv])) == rows(torch.cat([c.train_x for c in fed]))
    with pytest.raises(ValueError, match="fraction"):
        server_validation_split(fed, fraction=1.0)


def test_resize_images_is_block_averaging_when_shrinking():
    x = torch.rand(3, 1, 28, 28)
    small = resize_images(x, 8, crop=2)  # 24x24 -> 8x8: mean of 3x3 blocks
    expected = x[:, :, 2:-2, 2:-2].numpy().reshape(3, 1, 8, 3, 8, 3).mean(axis=(3, 5))
    np.testing.assert_allclose(small.numpy(), expected, rtol=1e-5)
    big = resize_images(torch.rand(2, 1, 8, 8), 28, pad=4, channels=3)
    assert big.shape == (2, 3, 28, 28) and float(big[..., :4, :].abs().max()) == 0.0
    with pytest.raises(ValueError, match="crop"):
        resize_images(x, 8, crop=14)


def test_external_validation_set_from_digits():
    x, y = external_validation_set("digits", (1, 28, 28), num_samples=50, pad=4, seed=0)
    assert x.shape == (50, 1, 28, 28) and y.shape == (50,)
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    with pytest.raises(ValueError, match="num_samples"):
        external_validation_set("digits", (1, 8, 8), num_samples=10**6)


def test_fedvg_weights_in_float16_are_finite():
    norms = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, 0.5]], dtype=torch.float16)
    for w in (fedvg_weights(norms), fedvg_layerwise_weights(norms)):
        assert w.dtype == torch.float16 and bool(torch.isfinite(w).all())
        torch.testing.assert_close(w.sum(0).float(), torch.ones(w.shape[1:]), atol=2e-3, rtol=0)

"""FedVG: validation-gradient norms (signals), weights (aggregators), the strategy, validation sets."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu import federated_dataset, make_model
from fedlearn_edu.aggregators import (
    fedavg,
    fedvg_aggregate,
    fedvg_layerwise_weights,
    fedvg_mixed_weights,
    fedvg_weights,
)
from fedlearn_edu.data import external_validation_set, resize_images, server_validation_split
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.params import get_params, unstack_params
from fedlearn_edu.signals import validation_gradient_norms, validation_gradients
from tests.fedvg_inputs import perturbed_clients, validation_set

norm_values = st.floats(0.0, 1e3, allow_nan=False, width=64)


def _loop_reference(model, stacked, x, y, batch_size=32):
    """The authors' procedure with nn.Module + .backward(): load theta_k, batches of 32, summed CE,
    accumulate .grad over batches, divide by the number of batches."""
    out = []
    for theta in unstack_params(stacked):
        net = make_model("mlp", (1, 8, 8), 10, hidden=(12,))
        net.load_state_dict(theta)
        net.train()
        net.zero_grad()
        batches = 0
        for s in range(0, y.shape[0], batch_size):
            F.cross_entropy(net(x[s : s + batch_size]), y[s : s + batch_size], reduction="sum").backward()
            batches += 1
        out.append({k: p.grad.detach().clone() / batches for k, p in net.named_parameters()})
    return out


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


# ---------------------------------------------------------------- validation gradients (signals)
@pytest.mark.parametrize("n_val", [70, 32, 5])
def test_batched_gradients_equal_a_plain_per_client_loop(n_val):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = perturbed_clients(model, 4)
    x, y = validation_set(n_val)
    ref = _loop_reference(model, stacked, x, y)
    for kwargs in ({}, {"sample_chunk": 9}, {"memory_budget": 1}, {"engine": "loop"}):
        got = validation_gradients(model, stacked, (x, y), **kwargs)
        for k in stacked:
            torch.testing.assert_close(got[k], torch.stack([r[k] for r in ref]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
def test_norms_p1_p2_equal_numpy_on_the_reference_gradients(p):
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0)
    stacked = perturbed_clients(model, 3, seed=2)
    x, y = validation_set(45)
    ref = _loop_reference(model, stacked, x, y)
    norms = validation_gradient_norms(model, stacked, (x, y), norm_order=p)
    assert norms.shape == (3, len(stacked))
    expected = np.array(
        [[np.abs(r[k].numpy()).sum() if p == 1 else np.sqrt((r[k].numpy() ** 2).sum()) for k in stacked] for r in ref]
    )
    np.testing.assert_allclose(norms.numpy(), expected, rtol=1e-4)


def test_validation_gradients_do_not_touch_the_model_and_keep_its_mode():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(12,), seed=0).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    validation_gradient_norms(model, perturbed_clients(model, 2), validation_set(10))
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_model_fit_to_the_validation_set_has_the_smaller_gradient():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(16,), seed=0)
    x, y = validation_set(64)
    from fedlearn_edu.engine import LoopEngine

    fit = LoopEngine().train(model, get_params(model), [(x, y)], LocalTraining(epochs=40, batch_size=16, lr=0.2), [0])
    far = perturbed_clients(model, 1, scale=1.0)
    both = {k: torch.cat([fit.params[k], far[k]]) for k in far}
    s = fedvg_weights(validation_gradient_norms(model, both, (x, y)))
    assert float(s[0]) > 0.7


# ---------------------------------------------------------------- the strategy


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

"""Synthetic federations (:mod:`fedlearn_edu.data.synthetic`): shapes, the documented distributions, labels and
knobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlearn_edu.data import synthetic_federated


# --------------------------------------------------------------------------- #
# synthetic
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def synth():
    return synthetic_federated(1.0, 1.0, num_clients=30, seed=0)


def test_synthetic_shapes_sizes_and_split(synth):
    assert synth.num_clients == 30 and synth.input_shape == (60,) and synth.num_classes == 10
    expected = np.random.RandomState(0).lognormal(4, 2, 30).astype(int) + 50  # FedProx's size draw
    sizes = [c.info["num_samples"] for c in synth]
    np.testing.assert_array_equal(sizes, expected)
    for c in synth:
        n = c.info["num_samples"]
        assert n >= 50 and c.num_train == int(0.9 * n) and c.num_test == n - int(0.9 * n)
        assert c.train_x.dtype == torch.float32 and c.train_y.dtype == torch.int64
        assert 0 <= int(c.train_y.min()) and int(c.train_y.max()) <= 9


def test_synthetic_parameters_follow_documented_distributions(synth):
    for c in synth:
        W, b, v, u, B = (c.info[k] for k in ("W", "b", "v", "u", "B"))
        assert W.shape == (60, 10) and b.shape == (10,) and v.shape == (60,)
        assert abs(W.mean() - u) < 0.2 and 0.85 < W.std() < 1.15  # W ~ N(u, 1), 600 entries
        assert abs(v.mean() - B) < 0.6  # v ~ N(B, 1), 60 entries
    us = np.array([c.info["u"] for c in synth])
    assert 0.4 < us.std() < 1.8  # u ~ N(0, alpha=1) over 30 clients


def test_synthetic_inputs_have_the_documented_covariance(synth):
    big = max(synth, key=lambda c: c.info["num_samples"])
    n = big.info["num_samples"]
    assert n > 2000
    x = torch.cat([big.train_x, big.test_x]).double().numpy()
    target = np.arange(1, 61, dtype=float) ** -1.2
    rel = x.var(axis=0, ddof=1) / target
    assert np.all(np.abs(rel - 1) < 5 * np.sqrt(2 / n))
    assert np.all(np.abs(x.mean(0) - big.info["v"]) < 5 * np.sqrt(target / n))


def test_synthetic_labels_are_argmax_of_the_client_model(synth):
    for c in list(synth)[:10]:
        x = torch.cat([c.train_x, c.test_x]).double().numpy()
        y = torch.cat([c.train_y, c.test_y]).numpy()
        pred = np.argmax(x @ c.info["W"] + c.info["b"], axis=1)
        assert np.mean(pred == y) > 0.995  # float32 storage may flip a rare near-tie


def test_synthetic_iid_variant_and_heterogeneity_knobs():
    fed = synthetic_federated(0.0, 0.0, num_clients=6, seed=1, iid=True)
    W0, b0 = fed[0].info["W"], fed[0].info["b"]
    for c in fed:
        assert np.array_equal(c.info["W"], W0) and np.array_equal(c.info["b"], b0)
        assert np.all(c.info["v"] == 0)
    assert abs(W0.mean()) < 0.2 and 0.85 < W0.std() < 1.15
    zero = synthetic_federated(0.0, 0.0, num_clients=6, seed=1)
    assert all(c.info["u"] == 0.0 and c.info["B"] == 0.0 for c in zero)
    assert not np.array_equal(zero[0].info["W"], zero[1].info["W"])  # W_k still differ (std 1)


def test_synthetic_cap_determinism_and_errors():
    a = synthetic_federated(0.5, 0.5, num_clients=10, seed=3, max_samples=80)
    b = synthetic_federated(0.5, 0.5, num_clients=10, seed=3, max_samples=80)
    assert max(c.info["num_samples"] for c in a) <= 80
    assert all(torch.equal(p.train_x, q.train_x) for p, q in zip(a, b))
    with pytest.raises(ValueError):
        synthetic_federated(-1.0, 0.0)
    with pytest.raises(ValueError):
        synthetic_federated(0.0, float("nan"))
    with pytest.raises(ValueError):
        synthetic_federated(0.0, 0.0, test_fraction=1.0)

"""The partitions (:mod:`fedlearn_edu.data.partition`): invariants on random labels, Dirichlet, shards and
quantity skew; quantity skew keeps a partition at any sigma."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedlearn_edu.data import (
    dirichlet_partition,
    iid_partition,
    load_dataset,
    partition_label_counts,
    quantity_skew_partition,
    shard_partition,
)


def test_quantity_skew_with_huge_sigma_keeps_min_size_and_a_partition():
    parts = quantity_skew_partition(1000, 10, sigma=1000.0, min_size=10, seed=0)
    allidx = np.concatenate(parts)
    assert min(len(p) for p in parts) >= 10
    assert np.array_equal(np.sort(allidx), np.arange(1000))


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def assert_is_partition(parts, n, num_clients):
    assert len(parts) == num_clients
    for p in parts:
        assert isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "indices must be sorted and unique within a client"
    allidx = np.concatenate(parts)
    assert allidx.size == n
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def mean_label_entropy(labels, parts):
    counts = partition_label_counts(labels, parts).astype(float)
    p = counts / counts.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(1)
    return float(h.mean())


@pytest.fixture(scope="module")
def digit_labels():
    train, test = load_dataset("digits")
    return np.concatenate([train.tensors[1].numpy(), test.tensors[1].numpy()])


labels_strategy = st.integers(1, 6).flatmap(
    lambda c: st.lists(st.integers(0, c - 1), min_size=20, max_size=300).map(lambda v: np.asarray(v, dtype=np.int64))
)


# --------------------------------------------------------------------------- #
# partitions: invariants
# --------------------------------------------------------------------------- #
@FAST
@given(n=st.integers(1, 400), data=st.data())
def test_iid_partition_is_balanced_partition(n, data):
    k = data.draw(st.integers(1, n))
    parts = iid_partition(n, k, seed=data.draw(st.integers(0, 5)))
    assert_is_partition(parts, n, k)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@FAST
@given(y=labels_strategy, data=st.data())
def test_dirichlet_partition_invariants(y, data):
    n = y.size
    k = data.draw(st.integers(1, min(25, n)))
    min_size = data.draw(st.integers(0, n // k))
    alpha = data.draw(st.sampled_from([0.001, 0.05, 0.5, 5.0, 1000.0]))
    seed = data.draw(st.integers(0, 3))
    parts = dirichlet_partition(y, k, alpha, min_size=min_size, seed=seed, max_tries=20)
    assert_is_partition(parts, n, k)
    assert min(len(p) for p in parts) >= min_size
    again = dirichlet_partition(y, k, alpha, min_size=min_size, seed=seed, max_tries=20)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


@FAST
@given(y=labels_strategy, data=st.data())
def test_shard_partition_invariants(y, data):
    n = y.size
    s = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(1, max(1, n // s)))
    parts = shard_partition(y, k, shards_per_client=s, seed=data.draw(st.integers(0, 3)))
    assert_is_partition(parts, n, k)
    sizes = [len(p) for p in parts]
    # shards differ in size by at most one, so clients by at most s
    assert max(sizes) - min(sizes) <= s


@FAST
@given(n=st.integers(1, 400), data=st.data())
def test_quantity_skew_partition_invariants(n, data):
    k = data.draw(st.integers(1, min(30, n)))
    min_size = data.draw(st.integers(0, n // k))
    sigma = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    parts = quantity_skew_partition(n, k, sigma=sigma, min_size=min_size, seed=data.draw(st.integers(0, 3)))
    assert_is_partition(parts, n, k)
    assert min(len(p) for p in parts) >= max(min_size, 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda y, s: iid_partition(y, 10, seed=s),
        lambda y, s: dirichlet_partition(y, 10, 0.5, min_size=5, seed=s),
        lambda y, s: shard_partition(y, 10, 2, seed=s),
        lambda y, s: quantity_skew_partition(y, 10, sigma=1.0, min_size=5, seed=s),
    ],
    ids=["iid", "dirichlet", "shards", "quantity"],
)
def test_partitions_deterministic_and_seed_dependent(make, digit_labels):
    a, b, c = make(digit_labels, 0), make(digit_labels, 0), make(digit_labels, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_partitions_accept_tensor_and_list_labels(digit_labels):
    ref = dirichlet_partition(digit_labels, 5, 0.3, seed=2)
    for y in (torch.as_tensor(digit_labels), digit_labels.tolist()):
        got = dirichlet_partition(y, 5, 0.3, seed=2)
        assert all(np.array_equal(a, b) for a, b in zip(ref, got))


# --------------------------------------------------------------------------- #
# Dirichlet specifics
# --------------------------------------------------------------------------- #
def test_dirichlet_tiny_alpha_many_clients_is_fast_and_valid(digit_labels):
    t0 = time.perf_counter()
    parts = dirichlet_partition(digit_labels, num_clients=100, alpha=0.01, min_size=5, seed=0)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0
    assert_is_partition(parts, digit_labels.size, 100)
    assert min(len(p) for p in parts) >= 5
    # still strongly skewed: most clients see a single class
    classes_per_client = (partition_label_counts(digit_labels, parts) > 0).sum(1)
    assert np.median(classes_per_client) == 1
    assert classes_per_client.mean() < 2.0


def test_dirichlet_label_skew_grows_as_alpha_shrinks(digit_labels):
    h = {
        a: np.mean(
            [
                mean_label_entropy(digit_labels, dirichlet_partition(digit_labels, 20, a, min_size=10, seed=s))
                for s in range(3)
            ]
        )
        for a in (0.1, 1.0, 100.0)
    }
    assert h[0.1] < h[1.0] < h[100.0]
    assert h[100.0] > 0.9 * np.log(10)  # near-IID: close to the maximal entropy
    assert h[0.1] < 0.5 * np.log(10)


def test_dirichlet_impossible_request_fails_immediately():
    y = np.repeat(np.arange(10), 10)  # n = 100
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"Impossible request.*min_size") as err:
        dirichlet_partition(y, num_clients=20, alpha=0.5, min_size=6, max_tries=10**9)
    assert time.perf_counter() - t0 < 1.0
    assert "min_size <= 5" in str(err.value)


def test_dirichlet_without_repair_gives_bounded_clear_error():
    y = np.repeat(np.arange(10), 30)
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as err:
        dirichlet_partition(y, num_clients=50, alpha=0.001, min_size=5, max_tries=25, repair=False)
    assert time.perf_counter() - t0 < 2.0
    msg = str(err.value)
    for words in ("25", "min_size", "fewer", "larger alpha", "repair=True"):
        assert words in msg


def test_dirichlet_without_repair_succeeds_when_feasible(digit_labels):
    parts = dirichlet_partition(digit_labels, 20, 0.5, min_size=10, seed=0, repair=False)
    assert min(len(p) for p in parts) >= 10


def test_dirichlet_balance_trick_spreads_samples(digit_labels):
    # Without the trick, at small alpha the largest client takes far more than n/K.
    sizes_bal = [len(p) for p in dirichlet_partition(digit_labels, 30, 0.05, min_size=0, seed=0, balance=True)]
    sizes_raw = [len(p) for p in dirichlet_partition(digit_labels, 30, 0.05, min_size=0, seed=0, balance=False)]
    assert max(sizes_bal) < max(sizes_raw)


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(alpha=-1.0), ValueError),
        (dict(alpha=0.0), ValueError),
        (dict(alpha=float("nan")), ValueError),
        (dict(alpha=float("inf")), ValueError),
        (dict(alpha=0.5, num_clients=0), ValueError),
        (dict(alpha=0.5, num_clients=2.5), TypeError),
        (dict(alpha=0.5, min_size=-1), ValueError),
        (dict(alpha=0.5, max_tries=0), ValueError),
    ],
)
def test_dirichlet_rejects_bad_arguments(kwargs, exc):
    y = np.repeat(np.arange(5), 20)
    args = dict(num_clients=4, min_size=2)
    args.update(kwargs)
    with pytest.raises(exc):
        dirichlet_partition(y, **args)


@pytest.mark.parametrize(
    "labels",
    [
        np.array([0.0, 1.0, np.nan, 1.0]),
        np.array([0.5, 1.0, 2.0, 1.0]),
        np.array([[0, 1], [1, 0]]),
        np.array([0, -1, 1, 2]),
        np.array([], dtype=np.int64),
    ],
)
def test_partitions_reject_bad_labels(labels):
    with pytest.raises(ValueError):
        dirichlet_partition(labels, 2, 1.0, min_size=0)
    with pytest.raises(ValueError):
        shard_partition(labels, 2, 1)


# --------------------------------------------------------------------------- #
# shards, quantity
# --------------------------------------------------------------------------- #
def test_shards_give_at_most_k_classes_when_classes_fill_whole_shards():
    y = np.repeat(np.arange(10), 100)  # shards of 1000 / (50 * 2) = 10 never straddle a class
    parts = shard_partition(y, num_clients=50, shards_per_client=2, seed=0)
    classes = (partition_label_counts(y, parts) > 0).sum(1)
    assert classes.max() <= 2
    assert classes.mean() > 1.5  # shards are dealt at random, not neighbour to neighbour
    assert all(len(p) == 20 for p in parts)


def test_shards_on_digits_are_pathological(digit_labels):
    parts = shard_partition(digit_labels, num_clients=20, shards_per_client=2, seed=0)
    classes = (partition_label_counts(digit_labels, parts) > 0).sum(1)
    assert classes.max() <= 4  # each of the 2 shards can straddle one class boundary
    assert classes.mean() <= 3.0
    with pytest.raises(ValueError, match="shards"):
        shard_partition(digit_labels, num_clients=1000, shards_per_client=2)


def test_quantity_skew_sizes_follow_sigma():
    n, k = 5000, 50
    sizes0 = np.array([len(p) for p in quantity_skew_partition(n, k, sigma=0.0, min_size=10)])
    assert sizes0.max() - sizes0.min() <= 1
    cv = {}
    for sigma in (0.5, 2.0):
        sizes = np.array([len(p) for p in quantity_skew_partition(n, k, sigma=sigma, min_size=10, seed=0)])
        assert sizes.min() >= 10 and sizes.sum() == n
        cv[sigma] = sizes.std() / sizes.mean()
    assert cv[2.0] > 2 * cv[0.5] > 0


def test_quantity_skew_keeps_labels_iid(digit_labels):
    parts = quantity_skew_partition(digit_labels, 5, sigma=1.0, min_size=100, seed=0)
    for p in parts:
        freq = np.bincount(digit_labels[p], minlength=10) / len(p)
        assert np.all(np.abs(freq - 0.1) < 0.08)


def test_quantity_skew_rejects_bad_arguments():
    with pytest.raises(ValueError, match="Impossible"):
        quantity_skew_partition(100, 20, min_size=6)
    with pytest.raises(ValueError):
        quantity_skew_partition(100, 5, sigma=-1.0)
    with pytest.raises(ValueError):
        quantity_skew_partition(100, 5, sigma=float("nan"))
    with pytest.raises(ValueError):
        iid_partition(5, 6)

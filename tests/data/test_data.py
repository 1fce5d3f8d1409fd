"""Tests of the data layer: loaders, partitions, synthetic data, noise, plots."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedlearn_edu.data import (
    DATASETS,
    Federation,
    add_label_noise,
    dataset_info,
    dataset_or_digits,
    dirichlet_partition,
    federated_dataset,
    flip_labels,
    iid_partition,
    load_dataset,
    make_federation,
    partition_label_counts,
    plot_partition,
    quantity_skew_partition,
    read_idx,
    shard_partition,
    synthetic_federated,
)
from fedlearn_edu.data import sources as src_mod

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MNIST_DIR = Path(os.environ.get("FEDLEARN_DATA", "/nonexistent")) / "mnist"  # set by conftest.py
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


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


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    blob = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(blob)
    else:
        path.write_bytes(blob)


def write_tiny_idx_set(folder: Path, gz: bool, seed: int = 0, n_train=12, n_test=5):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for name, arr in arrays.items():
        write_idx(folder / name, arr, gz)
    return {k: v.astype(np.uint8) for k, v in arrays.items()}


def write_fake_cifar(root: Path, kind: str = "cifar10", n_batch=4, n_test=3, seed=0):
    """Tiny CIFAR folder in the real on-disk format (pickled dicts of uint8 [n, 3072])."""
    rng = np.random.default_rng(seed)
    if kind == "cifar10":
        folder, files, key, c = (
            root / "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
            "labels",
            10,
        )
    else:
        folder, files, key, c = root / "cifar-100-python", ["train", "test"], "fine_labels", 100
    folder.mkdir(parents=True)
    written = {}
    for f in files:
        n = n_test if f in ("test_batch", "test") else n_batch
        data = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
        labels = rng.integers(0, c, n).tolist()
        entry = {"batch_label": f, "data": data, key: labels, "filenames": [f"img{i}.png" for i in range(n)]}
        if kind == "cifar100":
            entry["coarse_labels"] = [lab // 5 for lab in labels]
        with open(folder / f, "wb") as fh:
            pickle.dump(entry, fh, protocol=2)
        written[f] = (data, np.asarray(labels))
    meta = "batches.meta" if kind == "cifar10" else "meta"
    with open(folder / meta, "wb") as fh:
        pickle.dump({"label_names": [str(i) for i in range(c)]}, fh, protocol=2)
    return written


@pytest.fixture
def no_data_anywhere(tmp_path, monkeypatch):
    """Hide every place the loaders look at by default."""
    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    monkeypatch.delenv("FEDLEARN_OFFLINE", raising=False)
    monkeypatch.setattr(src_mod, "DEBIAN_FASHION_DIR", tmp_path / "no_debian_fashion")
    monkeypatch.chdir(tmp_path)
    return tmp_path


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


# --------------------------------------------------------------------------- #
# loaders
# --------------------------------------------------------------------------- #
def test_digits_split_is_fixed_stratified_and_scaled():
    (tr, te), (tr2, te2) = load_dataset("digits"), load_dataset("digits")
    x, y = tr.tensors
    assert x.shape == (1437, 1, 8, 8) and te.tensors[0].shape == (360, 1, 8, 8)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert torch.equal(x, tr2.tensors[0]) and torch.equal(te.tensors[1], te2.tensors[1])
    ratio = np.bincount(te.tensors[1].numpy(), minlength=10) / np.bincount(y.numpy(), minlength=10)
    assert np.all(np.abs(ratio - 0.25) < 0.02)  # stratified 80/20
    x[0, 0, 0, 0] = 123.0  # callers get their own copy
    assert float(load_dataset("digits")[0].tensors[0].max()) == 1.0


def test_real_mnist_from_fedlearn_data(monkeypatch):
    monkeypatch.setenv("FEDLEARN_DATA", str(MNIST_DIR.parent))
    train, test = load_dataset("mnist")
    (x, y), (xt, yt) = train.tensors, test.tensors
    assert x.shape == (60000, 1, 28, 28) and xt.shape == (10000, 1, 28, 28)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    np.testing.assert_array_equal(np.bincount(y.numpy()), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    np.testing.assert_array_equal(np.bincount(yt.numpy()), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    raw = read_idx(MNIST_DIR / "train-labels-idx1-ubyte.gz")
    assert hashlib.md5(raw.tobytes()).hexdigest() != ""  # readable directly too
    assert raw.dtype == np.uint8 and raw.shape == (60000,)


def test_real_fashion_mnist_from_debian_package(monkeypatch):
    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    train, test = load_dataset("fashion-mnist")
    assert train.tensors[0].shape == (60000, 1, 28, 28) and test.tensors[0].shape == (10000, 1, 28, 28)
    assert np.all(np.bincount(train.tensors[1].numpy()) == 6000)
    assert np.all(np.bincount(test.tensors[1].numpy()) == 1000)


def test_folder_holding_the_other_dataset_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLEARN_DATA", str(MNIST_DIR.parent))
    assert (FASHION_DIR / "train-labels-idx1-ubyte.gz").exists(), (
        "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist (.ci/run does)"
    )
    for f in FASHION_DIR.glob("*-ubyte.gz"):
        (tmp_path / f.name).symlink_to(f)
    train, _ = load_dataset("mnist", root=tmp_path)  # must fall through to the real MNIST
    assert np.bincount(train.tensors[1].numpy())[1] == 6742


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "raw"])
def test_tiny_idx_files_roundtrip(tmp_path, no_data_anywhere, gz):
    arrays = write_tiny_idx_set(tmp_path / "files", gz=gz)
    suffix = ".gz" if gz else ""
    np.testing.assert_array_equal(
        read_idx(tmp_path / "files" / f"train-images-idx3-ubyte{suffix}"), arrays["train-images-idx3-ubyte"]
    )
    train, test = load_dataset("mnist", root=tmp_path / "files")
    x, y = train.tensors
    assert x.shape == (12, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    np.testing.assert_allclose(x[:, 0].numpy(), arrays["train-images-idx3-ubyte"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(test.tensors[1].numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_fedlearn_data_env_subfolder(tmp_path, no_data_anywhere, monkeypatch):
    arrays = write_tiny_idx_set(tmp_path / "store" / "fashion-mnist", gz=True, seed=3, n_train=7, n_test=2)
    monkeypatch.setenv("FEDLEARN_DATA", str(tmp_path / "store"))
    train, test = load_dataset("fashion_mnist")
    assert train.tensors[0].shape == (7, 1, 28, 28) and test.tensors[0].shape == (2, 1, 28, 28)
    np.testing.assert_array_equal(train.tensors[1].numpy(), arrays["train-labels-idx1-ubyte"])


def test_read_idx_rejects_broken_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="holds 3 bytes"):
        read_idx(short)


def test_missing_mnist_error_names_places_and_fixes(tmp_path, no_data_anywhere, monkeypatch):
    monkeypatch.setenv("FEDLEARN_DATA", str(tmp_path / "envdir"))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("mnist", root=tmp_path / "myroot")
    msg = str(err.value)
    for place in (
        tmp_path / "myroot",
        tmp_path / "envdir",
        tmp_path / "envdir" / "mnist",
        tmp_path / "data" / "MNIST" / "raw",
    ):
        assert str(place) in msg
    assert 'load_dataset("mnist", download=True)' in msg and "FEDLEARN_DATA" in msg


def test_missing_fashion_error_suggests_apt(tmp_path, no_data_anywhere):
    write_tiny_idx_set(tmp_path / "partial", gz=False)
    (tmp_path / "partial" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("fashion_mnist", root=tmp_path / "partial")
    msg = str(err.value)
    assert "apt-get install dataset-fashion-mnist   (as root, or through sudo;" in msg
    assert "missing t10k-labels-idx1-ubyte" in msg
    assert str(tmp_path / "no_debian_fashion") in msg


def test_download_fallback_uses_torchvision_layout(tmp_path, no_data_anywhere, monkeypatch):
    import torchvision.datasets as tvd

    calls = []

    class FakeMNIST:  # stands in for torchvision's downloader (no internet here)
        def __init__(self, root, train=True, download=False):
            calls.append((root, train, download))
            raw = Path(root) / "MNIST" / "raw"
            if not raw.exists():
                write_tiny_idx_set(raw, gz=False, seed=5)

    monkeypatch.setattr(tvd, "MNIST", FakeMNIST)
    with pytest.raises(FileNotFoundError):
        load_dataset("mnist", root=tmp_path / "dl")
    assert calls == []
    train, test = load_dataset("mnist", root=tmp_path / "dl", download=True)
    assert calls and all(c[2] for c in calls)
    assert train.tensors[0].shape == (12, 1, 28, 28)
    # second time it is found locally, without calling the downloader
    calls.clear()
    load_dataset("mnist", root=tmp_path / "dl")
    assert calls == []


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_fedlearn_offline_turns_downloads_off(tmp_path, no_data_anywhere, monkeypatch, name):
    import torchvision.datasets as tvd

    def refuse(*args, **kwargs):
        raise AssertionError("torchvision was asked to download")

    monkeypatch.setattr(tvd, "MNIST", refuse)
    monkeypatch.setattr(tvd, "CIFAR10", refuse)
    monkeypatch.setenv("FEDLEARN_OFFLINE", "1")
    assert not src_mod.downloads_allowed()
    with pytest.raises(FileNotFoundError, match="FEDLEARN_OFFLINE is set, downloads are off"):
        load_dataset(name, root=tmp_path / "dl", download=True)
    assert dataset_or_digits(name, root=tmp_path / "dl") == "digits"
    monkeypatch.setenv("FEDLEARN_OFFLINE", "0")
    assert src_mod.downloads_allowed()
    with pytest.raises(AssertionError, match="asked to download"):  # "0" leaves downloads on
        load_dataset(name, root=tmp_path / "dl", download=True)


def test_fake_cifar10_is_read_in_nchw(tmp_path, no_data_anywhere):
    written = write_fake_cifar(tmp_path)
    train, test = load_dataset("cifar10", root=tmp_path)
    x, y = train.tensors
    assert x.shape == (20, 3, 32, 32) and test.tensors[0].shape == (3, 3, 32, 32)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    data1, labels1 = written["data_batch_1"]
    # CIFAR rows are the R plane, then G, then B, each 32x32 row-major
    i, c, h, w = 2, 1, 5, 7
    assert x[i, c, h, w].item() == pytest.approx(data1[i, c * 1024 + h * 32 + w] / 255.0)
    np.testing.assert_array_equal(y[:4].numpy(), labels1)
    np.testing.assert_array_equal(y[16:].numpy(), written["data_batch_5"][1])
    np.testing.assert_array_equal(test.tensors[1].numpy(), written["test_batch"][1])


def test_torchvision_rejects_the_fake_cifar_so_we_read_pickles_ourselves(tmp_path):
    import torchvision.datasets as tvd

    write_fake_cifar(tmp_path)
    with pytest.raises(RuntimeError, match="corrupted"):
        tvd.CIFAR10(str(tmp_path), train=True, download=False)  # md5 check of every batch


def test_fake_cifar100_and_missing_cifar(tmp_path, no_data_anywhere, monkeypatch):
    written = write_fake_cifar(tmp_path / "store", kind="cifar100", n_batch=6, n_test=2)
    monkeypatch.setenv("FEDLEARN_DATA", str(tmp_path / "store"))
    train, test = load_dataset("cifar100")
    assert train.tensors[0].shape == (6, 3, 32, 32)
    np.testing.assert_array_equal(train.tensors[1].numpy(), written["train"][1])
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cifar10")
    msg = str(err.value)
    assert str(tmp_path / "store" / "cifar-10-batches-py") in msg and "download=True" in msg


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError) as err:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(err.value)
    assert dataset_info("CIFAR-100").num_classes == 100 and len(dataset_info("cifar100").classes) == 100
    assert dataset_info("fashion_mnist").input_shape == (1, 28, 28)


# --------------------------------------------------------------------------- #
# federated_dataset
# --------------------------------------------------------------------------- #
def test_federated_digits_dirichlet():
    fed = federated_dataset("digits", "dirichlet", num_clients=20, alpha=0.1, min_size=10, seed=0)
    assert isinstance(fed, Federation) and fed.num_clients == 20
    assert fed.input_shape == (1, 8, 8) and fed.num_classes == 10
    assert int(fed.num_train_samples.sum() + fed.num_test_samples.sum()) == 1797  # train+test merged
    assert int((fed.num_train_samples + fed.num_test_samples).min()) >= 10
    assert "dirichlet" in fed.name.lower() and "0.1" in fed.name
    ref = federated_dataset("digits", "dirichlet", num_clients=20, alpha=0.1, min_size=10, seed=0)
    assert all(torch.equal(a.train_y, b.train_y) and torch.equal(a.test_x, b.test_x) for a, b in zip(fed, ref))
    # local test split is about 20%
    frac = fed.num_test_samples.sum().item() / 1797
    assert 0.17 < frac < 0.23


@pytest.mark.parametrize("partition", ["iid", "shards", "quantity"])
def test_federated_digits_other_partitions(partition):
    fed = federated_dataset("digits", partition, num_clients=10, seed=1)
    assert fed.num_clients == 10
    assert int(fed.num_train_samples.sum() + fed.num_test_samples.sum()) == 1797


def test_federated_dataset_options_and_errors():
    fed = federated_dataset("digits", "iid", num_clients=5, merge=False)
    assert int(fed.num_train_samples.sum() + fed.num_test_samples.sum()) == 1437
    fed = federated_dataset("digits", "iid", num_clients=5, num_samples=500, test_fraction=0.0)
    assert int(fed.num_train_samples.sum()) == 500 and int(fed.num_test_samples.sum()) == 0
    with pytest.raises(ValueError, match="iid, dirichlet, shards, quantity"):
        federated_dataset("digits", "label_skew")
    with pytest.raises(ValueError):
        federated_dataset("digits", "dirichlet", alpha=-0.1)
    with pytest.raises(ValueError):
        federated_dataset("digits", num_clients=0)


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


# --------------------------------------------------------------------------- #
# plotting
# --------------------------------------------------------------------------- #
def test_plot_partition_returns_axes_for_every_kind():
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes

    fed = federated_dataset("digits", "dirichlet", num_clients=8, alpha=0.3, seed=0)
    for kind in ("bubble", "bar", "heatmap"):
        ax = plot_partition(fed, kind=kind)
        assert isinstance(ax, Axes)
        assert ax.get_title() == fed.name
        plt.close(ax.figure)
    counts = fed.label_counts("train")
    ax = plot_partition(counts, kind="bar", class_names=[f"c{i}" for i in range(10)])
    # the stacked bars of client i add up to its number of training samples
    widths = np.zeros(8)
    for patch in ax.patches:
        widths[int(round(patch.get_y() + patch.get_height() / 2))] += patch.get_width()
    np.testing.assert_allclose(widths, counts.sum(1))
    plt.close(ax.figure)
    fig, ax0 = plt.subplots()
    assert plot_partition(counts, ax=ax0) is ax0
    plt.close(fig)
    with pytest.raises(ValueError):
        plot_partition(counts, kind="pie")
    with pytest.raises(ValueError):
        plot_partition(np.zeros(5))

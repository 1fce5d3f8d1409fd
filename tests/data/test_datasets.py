"""The data sets (:mod:`fedlearn_edu.data.datasets`): loaders (MNIST, Fashion-MNIST, CIFAR; where files are
looked for, downloads) and federated_dataset."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlearn_edu.data import (
    DATASETS,
    Federation,
    dataset_info,
    dataset_or_digits,
    federated_dataset,
    load_dataset,
    read_idx,
)
from fedlearn_edu.data import sources as src_mod
from tests import needs_data
from tests.needs_data import require_fashion_mnist, require_mnist


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
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
    mnist_dir = require_mnist()  # skips, saying why, where MNIST is absent (fails in .ci/run)
    monkeypatch.setenv("FEDLEARN_DATA", str(mnist_dir.parent))
    train, test = load_dataset("mnist")
    (x, y), (xt, yt) = train.tensors, test.tensors
    assert x.shape == (60000, 1, 28, 28) and xt.shape == (10000, 1, 28, 28)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    np.testing.assert_array_equal(np.bincount(y.numpy()), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    np.testing.assert_array_equal(np.bincount(yt.numpy()), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    raw = read_idx(mnist_dir / "train-labels-idx1-ubyte.gz")
    assert hashlib.md5(raw.tobytes()).hexdigest() != ""  # readable directly too
    assert raw.dtype == np.uint8 and raw.shape == (60000,)


def test_real_fashion_mnist_from_debian_package(monkeypatch):
    require_fashion_mnist()
    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    train, test = load_dataset("fashion-mnist")
    assert train.tensors[0].shape == (60000, 1, 28, 28) and test.tensors[0].shape == (10000, 1, 28, 28)
    assert np.all(np.bincount(train.tensors[1].numpy()) == 6000)
    assert np.all(np.bincount(test.tensors[1].numpy()) == 1000)


def test_folder_holding_the_other_dataset_is_skipped(tmp_path, monkeypatch):
    mnist_dir, fashion_dir = require_mnist(), require_fashion_mnist()
    monkeypatch.setenv("FEDLEARN_DATA", str(mnist_dir.parent))
    for f in fashion_dir.glob("*-ubyte.gz"):
        (tmp_path / f.name).symlink_to(f)
    train, _ = load_dataset("mnist", root=tmp_path)  # must fall through to the real MNIST
    assert np.bincount(train.tensors[1].numpy())[1] == 6742


@pytest.mark.parametrize(
    ("required", "fails"),
    [("", False), ("mnist", False), ("fashion-mnist", True), ("mnist,fashion-mnist", True), ("1", True)],
)
def test_absent_data_skips_with_its_reason_unless_required(tmp_path, monkeypatch, required, fails):
    """A newcomer's clone skips, saying what is missing and how to get it; .ci/run's FEDLEARN_REQUIRE_DATA fails."""
    monkeypatch.setattr(needs_data, "FASHION_DIR", tmp_path / "no-fashion")
    monkeypatch.setenv("FEDLEARN_REQUIRE_DATA", required)
    with pytest.raises(pytest.fail.Exception if fails else pytest.skip.Exception) as stop:
        needs_data.require_fashion_mnist()
    assert f"Fashion-MNIST is absent ({tmp_path / 'no-fashion'}" in str(stop.value)
    assert "apt-get install dataset-fashion-mnist" in str(stop.value)
    (tmp_path / "no-fashion").mkdir()
    (tmp_path / "no-fashion" / "train-labels-idx1-ubyte.gz").write_bytes(b"")
    assert needs_data.require_fashion_mnist() == tmp_path / "no-fashion"  # present: the test runs


def test_ci_requires_the_data_it_installs():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    assert 'FEDLEARN_REQUIRE_DATA="fashion-mnist"' in ci and "apt-get install -y -qq dataset-fashion-mnist" in ci
    assert 'FEDLEARN_REQUIRE_DATA+=",mnist"' in ci and "export FEDLEARN_REQUIRE_DATA" in ci


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

"""Datasets as tensors, and federated versions of them.

:func:`load_dataset` returns ``(train, test)`` as
:class:`torch.utils.data.TensorDataset` with float32 inputs in ``[0, 1]``
(images in NCHW layout) and int64 labels. :func:`federated_dataset` goes one
step further: load, partition over clients, split each client 80/20 into
local train/test, and return a :class:`~fedlearn_edu.data.Federation`.

Where the files come from (nothing is downloaded unless ``download=True``, and nothing
while ``FEDLEARN_OFFLINE=1``; the search order is in ``fedlearn_edu.data.sources``, the
parsing in ``fedlearn_edu.data.readers``):

==================  =========================================================
``"digits"``        bundled with scikit-learn (the offline default), 1,797 8x8 images
``"mnist"``         the four IDX files, searched in ``root``, ``$FEDLEARN_DATA``
                    and ``./data/MNIST/raw``
``"fashion_mnist"`` the four IDX files, searched in ``root``, ``$FEDLEARN_DATA``,
                    ``/usr/share/datasets/fashion-mnist`` (Debian package
                    ``dataset-fashion-mnist``) and ``./data/FashionMNIST/raw``
``"cifar10"``       ``cifar-10-batches-py`` (the python batches) below ``root`` or
                    ``$FEDLEARN_DATA`` only, read without running code from them
``"cifar100"``      ``cifar-100-python`` below the same places
==================  =========================================================
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from ..checks import check_int, check_positive, check_seed
from .federation import Federation, make_federation
from .partition import PARTITIONS
from .readers import read_cifar_batches, read_idx
from .sources import (
    CIFAR_LAYOUT,
    ENV_VAR,
    IDX_STEMS,
    OFFLINE_VAR,
    TORCHVISION_RAW,
    download_root,
    downloads_allowed,
    find_idx_files,
    locate_cifar,
    locate_idx,
    log_request,
)

__all__ = [
    "DatasetInfo",
    "DATASETS",
    "dataset_info",
    "load_dataset",
    "read_idx",
    "federated_dataset",
    "PARTITIONS",
]

# --------------------------------------------------------------------------- #
# catalogue
# --------------------------------------------------------------------------- #
_CIFAR100_CLASSES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus "
    "butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch "
    "crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo "
    "keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse "
    "mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy "
    "porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper "
    "snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television "
    "tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()


@dataclass(frozen=True)
class DatasetInfo:
    """Facts about a dataset :func:`load_dataset` knows.

    Attributes:
        name: canonical name, e.g. ``"fashion_mnist"``.
        num_classes: size of the label space.
        input_shape: shape of one input ``(C, H, W)``.
        num_train: size of the official training split.
        num_test: size of the official test split.
        classes: class names, index = label.
    """

    name: str
    num_classes: int
    input_shape: tuple
    num_train: int
    num_test: int
    classes: tuple


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo("digits", 10, (1, 8, 8), 1437, 360, tuple(str(i) for i in range(10))),
    "mnist": DatasetInfo("mnist", 10, (1, 28, 28), 60000, 10000, tuple(str(i) for i in range(10))),
    "fashion_mnist": DatasetInfo(
        "fashion_mnist",
        10,
        (1, 28, 28),
        60000,
        10000,
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    ),
    "cifar10": DatasetInfo(
        "cifar10",
        10,
        (3, 32, 32),
        50000,
        10000,
        ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    ),
    "cifar100": DatasetInfo("cifar100", 100, (3, 32, 32), 50000, 10000, tuple(_CIFAR100_CLASSES)),
}
assert len(_CIFAR100_CLASSES) == 100

_ALIASES = {"fashion": "fashion_mnist", "fmnist": "fashion_mnist", "cifar_10": "cifar10", "cifar_100": "cifar100"}


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"Dataset name must be a string, got {type(name).__name__}.")
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"Unknown dataset {name!r}. Valid names: {', '.join(sorted(DATASETS))}.")
    return key


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``name`` (see :data:`DATASETS`).

    Args:
        name: a dataset name (case and ``-``/``_`` do not matter; aliases such as ``"fmnist"``).

    Returns:
        Its :class:`DatasetInfo`.

    Example:
        >>> dataset_info("cifar10").num_classes
        10
        >>> dataset_info("digits").input_shape
        (1, 8, 8)
    """
    return DATASETS[_canonical(name)]


# --------------------------------------------------------------------------- #
# IDX files (MNIST, Fashion-MNIST)
# --------------------------------------------------------------------------- #
def _stamp(p: Path) -> tuple:
    st = p.stat()
    return (str(p.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_idx_set(stamps: tuple) -> tuple[np.ndarray, ...]:
    arrays = tuple(read_idx(s[0]) for s in stamps)
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _may_download(download: bool, notes: list) -> bool:
    """``download``, unless ``FEDLEARN_OFFLINE`` turns downloads off (then said in ``notes``)."""
    if download and not downloads_allowed():
        notes.append(f"  (no download: {OFFLINE_VAR} is set, downloads are off)")
        return False
    return download


def _load_idx_dataset(name: str, root, download: bool):
    folder, notes = locate_idx(name, root)
    if folder is None and _may_download(download, notes):
        from torchvision import datasets as tvd

        cls = tvd.MNIST if name == "mnist" else tvd.FashionMNIST
        dl_root = download_root(root)
        for train in (True, False):
            cls(str(dl_root), train=train, download=True)
        candidate = dl_root / TORCHVISION_RAW[name]
        if not find_idx_files(candidate)[1]:
            folder = candidate
        else:
            notes.append(f"  {candidate}  (torchvision download left no complete IDX set)")
    if folder is None:
        fixes = []
        if name == "fashion_mnist":
            fixes.append(
                "apt-get install dataset-fashion-mnist   (as root, or through sudo; Debian/Ubuntu, no "
                "internet needed beyond the package mirror; installs /usr/share/datasets/fashion-mnist)"
            )
        fixes += [
            f'load_dataset("{name}", download=True)   (downloads with torchvision into {download_root(root)})',
            f"put the four files ({', '.join(s[0] for s in IDX_STEMS.values())}, .gz or not) "
            f"in a folder and pass root=that_folder or set {ENV_VAR}=that_folder",
        ]
        raise FileNotFoundError(
            f"Could not find the {name} IDX files. Looked in, in this order:\n"
            + "\n".join(notes)
            + "\nTo fix, do one of:\n"
            + "\n".join(f"  - {f}" for f in fixes)
        )
    found, _ = find_idx_files(folder)
    order = ("train_images", "train_labels", "test_images", "test_labels")
    arrays = dict(zip(order, _read_idx_set(tuple(_stamp(found[r]) for r in order))))
    out = []
    for split in ("train", "test"):
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"{folder}: {split} images {x.shape} and labels {y.shape} do not match (expected [n, H, W] and [n])."
            )
        if y.size and (int(y.min()) < 0 or int(y.max()) > 9):
            raise ValueError(f"{folder}: {split} labels outside 0..9.")
        xt = torch.from_numpy(np.asarray(x, dtype=np.float32) / 255.0).unsqueeze(1)
        yt = torch.from_numpy(y.astype(np.int64))
        out.append(TensorDataset(xt, yt))
    return out[0], out[1]


# --------------------------------------------------------------------------- #
# CIFAR (python batches, read by readers.SafeUnpickler)
# --------------------------------------------------------------------------- #
def _load_cifar(name: str, root, download: bool):
    folder_name, train_files, test_files, label_key = CIFAR_LAYOUT[name]
    folder, notes = locate_cifar(name, root)
    if folder is None and _may_download(download, notes):
        from torchvision import datasets as tvd

        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        dl_root = download_root(root)
        cls(str(dl_root), train=True, download=True)  # downloads, checks md5, extracts
        folder = dl_root / folder_name
    if folder is None:
        raise FileNotFoundError(
            f"Could not find {name} ({folder_name}/ with {', '.join(train_files + test_files)}). "
            "Looked in, in this order:\n" + "\n".join(notes) + "\nTo fix, do one of:\n"
            f'  - load_dataset("{name}", download=True)   (needs internet; downloads with torchvision '
            f"into {download_root(root) / folder_name})\n"
            f"  - extract the official python archive so that {folder_name}/ sits in a folder, and pass "
            f"root=that_folder or set {ENV_VAR}=that_folder"
        )
    num_classes = DATASETS[name].num_classes
    out = []
    for files in (train_files, test_files):
        x, y = read_cifar_batches([folder / f for f in files], label_key)
        if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise ValueError(f"{folder}: labels outside 0..{num_classes - 1}.")
        out.append(TensorDataset(torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y)))
    return out[0], out[1]


# --------------------------------------------------------------------------- #
# digits
# --------------------------------------------------------------------------- #
@functools.lru_cache(maxsize=1)
def _digits_arrays():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = y.astype(np.int64)
    arrays = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _load_digits():
    x_tr, x_te, y_tr, y_te = _digits_arrays()
    return (
        TensorDataset(torch.tensor(x_tr), torch.tensor(y_tr)),
        TensorDataset(torch.tensor(x_te), torch.tensor(y_te)),
    )


# --------------------------------------------------------------------------- #
# public loader
# --------------------------------------------------------------------------- #
def load_dataset(name: str, root=None, download: bool = False) -> tuple[TensorDataset, TensorDataset]:
    """Load a dataset as two in-memory tensor datasets.

    Args:
        name: ``"digits"``, ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"`` or ``"cifar100"``.
            ``"digits"`` (scikit-learn's bundled 8x8 digits) needs no files and is the
            offline default. Case and ``-``/``_`` do not matter.
        root: folder searched first (see ``fedlearn_edu.data.sources`` for the full
            order); also where ``download=True`` puts files (default ``$FEDLEARN_DATA``,
            else ``./data``).
        download: if the files are found nowhere, download them with torchvision
            (which checks the archives' published md5 sums). Files already present are
            used as they are. Ignored while the environment variable ``FEDLEARN_OFFLINE``
            is ``1``: the files must then be on disk.

    Returns:
        ``(train, test)`` :class:`~torch.utils.data.TensorDataset`: ``tensors[0]`` float32
        inputs in ``[0, 1]`` of shape ``[n, C, H, W]`` (``[n, 1, 8, 8]`` digits,
        ``[n, 1, 28, 28]`` MNIST / Fashion-MNIST, ``[n, 3, 32, 32]`` CIFAR);
        ``tensors[1]`` int64 labels ``[n]``. Digits: a fixed stratified 80/20 split
        (``random_state=0``), 1,437 / 360 images. The others: the official splits.

    Raises:
        ValueError: unknown ``name`` (the message lists the valid names), or files that
            are not in the expected format.
        FileNotFoundError: files not found and ``download=False`` (or ``FEDLEARN_OFFLINE=1``);
            the message lists every place looked at and the command that fixes it.

    MNIST and Fashion-MNIST are read by :func:`~fedlearn_edu.data.read_idx`.
    CIFAR's python batches are read by
    :func:`~fedlearn_edu.data.read_cifar_batches`, whose restricted unpickler
    builds arrays and plain data only (a crafted file raises instead of running code),
    and only from ``root`` or ``$FEDLEARN_DATA``, never from the working directory.

    Example:
        >>> train, test = load_dataset("digits")
        >>> train.tensors[0].shape, test.tensors[0].shape
        (torch.Size([1437, 1, 8, 8]), torch.Size([360, 1, 8, 8]))
    """
    key = _canonical(name)
    if key == "digits":
        return _load_digits()
    load = _load_idx_dataset if key in ("mnist", "fashion_mnist") else _load_cifar
    try:
        loaded = load(key, root, download)
    except Exception:
        log_request(key, found=False)
        raise
    log_request(key, found=True)
    return loaded


# --------------------------------------------------------------------------- #
# federated datasets
# --------------------------------------------------------------------------- #
def random_subset(x: Tensor, y: Tensor, num_samples, seed: int, source: str) -> tuple[Tensor, Tensor]:
    """A seeded random subset of ``num_samples`` samples, kept in their original order.

    Args:
        x: ``Tensor[n, ...]`` inputs.
        y: ``Tensor[n]`` labels.
        num_samples: how many to keep, ``1 <= num_samples <= n``.
        seed: seed of the choice.
        source: where the samples come from, for the error when too many are asked for.

    Returns:
        ``(x[keep], y[keep])``.
    """
    k = check_int(num_samples, "num_samples", 1)
    if k > y.shape[0]:
        raise ValueError(f"num_samples={k} exceeds the {y.shape[0]} samples {source}.")
    keep = torch.from_numpy(np.sort(np.random.default_rng(seed).choice(y.shape[0], k, replace=False)))
    return x[keep], y[keep]


def federated_dataset(
    name: str = "digits",
    partition: str = "dirichlet",
    num_clients: int = 20,
    alpha: float = 0.1,
    shards_per_client: int = 2,
    sigma: float = 1.0,
    min_size: int = 10,
    test_fraction: float = 0.2,
    seed: int = 0,
    root=None,
    download: bool = False,
    merge: bool = True,
    num_samples: int | None = None,
) -> Federation:
    """Load a dataset, split it over clients, and give each client a local train/test split.

    Steps: :func:`load_dataset`; with ``merge=True`` concatenate the official
    train and test splits (as CRAFT's code does: every sample ends up on some
    client); optionally keep a random subset of ``num_samples``; partition the
    labels; finally :func:`make_federation` holds out ``test_fraction`` of every
    client's samples as its local test split.

    Args:
        name: any name :func:`load_dataset` accepts.
        partition: a key of ``fedlearn_edu.data.PARTITIONS``: ``"iid"``
            (:func:`iid_partition`), ``"dirichlet"`` (:func:`dirichlet_partition`, uses
            ``alpha``, ``min_size``), ``"shards"`` (:func:`shard_partition`, uses
            ``shards_per_client``) or ``"quantity"`` (:func:`quantity_skew_partition`,
            uses ``sigma``, ``min_size``).
        num_clients: number of clients.
        alpha: Dirichlet concentration (only for ``"dirichlet"``).
        shards_per_client: shards per client (only for ``"shards"``).
        sigma: log-normal spread of client sizes (only for ``"quantity"``).
        min_size: least samples per client before the local train/test split.
        test_fraction: share of each client's samples kept as its local test split.
        seed: non-negative integer seeding the subset, the partition and the local splits.
        root: passed to :func:`load_dataset`.
        download: passed to :func:`load_dataset`.
        merge: partition train+test together. With ``False`` only the official train
            split is partitioned; get the untouched official test split with
            ``load_dataset(name)[1]`` (e.g. as a global test set).
        num_samples: use only a random subset of this many samples (quick CPU runs).

    Returns:
        A :class:`Federation` of ``num_clients`` clients; ``federation.name`` describes the setting.

    Example:
        >>> fed = federated_dataset("digits", "dirichlet", num_clients=10, alpha=0.5, seed=0)
        >>> fed.num_clients, fed.input_shape, fed.num_classes
        (10, (1, 8, 8), 10)
    """
    info = dataset_info(name)
    if not isinstance(partition, str) or partition not in PARTITIONS:
        raise ValueError(f"Unknown partition {partition!r}. Valid values: {', '.join(PARTITIONS)}.")
    seed = check_seed(seed)
    k = check_int(num_clients, "num_clients", 1)
    test_fraction = check_positive(test_fraction, "test_fraction", allow_zero=True)
    train, test = load_dataset(info.name, root=root, download=download)
    if merge:
        x = torch.cat([train.tensors[0], test.tensors[0]])
        y = torch.cat([train.tensors[1], test.tensors[1]])
    else:
        x, y = train.tensors
    if num_samples is not None:
        x, y = random_subset(x, y, num_samples, seed, "available")
    scheme = PARTITIONS[partition]
    options = dict(alpha=alpha, shards_per_client=shards_per_client, sigma=sigma, min_size=min_size)
    parts = scheme(y.numpy(), k, seed=seed, **options)
    desc = scheme.describe(options)
    return make_federation(
        x,
        y,
        parts,
        test_fraction=test_fraction,
        num_classes=info.num_classes,
        seed=seed,
        name=f"{info.name}, {desc}, {k} clients",
    )

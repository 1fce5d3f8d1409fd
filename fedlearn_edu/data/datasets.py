"""Datasets as tensors, and federated versions of them.

:func:`load_dataset` returns ``(train, test)`` as
:class:`torch.utils.data.TensorDataset` with float32 inputs in ``[0, 1]``
(images in NCHW layout) and int64 labels. :func:`federated_dataset` goes one
step further: load, partition over clients, split each client 80/20 into
local train/test, and return a :class:`~fedlearn_edu.data.Federation`.

Where the files come from (nothing is downloaded unless ``download=True``):

==================  =========================================================
``"digits"``        bundled with scikit-learn (the offline default), 1,797 8x8 images
``"mnist"``         the four IDX files, searched in ``root``, ``$FEDLEARN_DATA``,
                    this project's ``../shared/data/mnist`` and ``./data/MNIST/raw``
``"fashion_mnist"`` the four IDX files, searched in ``root``, ``$FEDLEARN_DATA``,
                    ``/usr/share/datasets/fashion-mnist`` (Debian package
                    ``dataset-fashion-mnist``) and ``./data/FashionMNIST/raw``
``"cifar10"``       ``cifar-10-batches-py`` (the python pickle batches) below
                    ``root``, ``$FEDLEARN_DATA`` or ``./data``
``"cifar100"``      ``cifar-100-python`` below the same places
==================  =========================================================
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from .federation import Federation, make_federation
from .partition import (
    _check_float,
    _check_int,
    dirichlet_partition,
    iid_partition,
    quantity_skew_partition,
    shard_partition,
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

    Attributes
    ----------
    name : str
        Canonical name, e.g. ``"fashion_mnist"``.
    num_classes : int
    input_shape : tuple of int
        Shape of one input (C, H, W).
    num_train, num_test : int
        Sizes of the official splits.
    classes : tuple of str
        Class names, index = label.
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

    Examples
    --------
    >>> dataset_info("cifar10").num_classes
    10
    >>> dataset_info("digits").input_shape
    (1, 8, 8)
    """
    return DATASETS[_canonical(name)]


# --------------------------------------------------------------------------- #
# places to look
# --------------------------------------------------------------------------- #
# Module-level so tests (and users with unusual layouts) can point them elsewhere.
_SHARED_MNIST_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "mnist"
_DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
_DEFAULT_DOWNLOAD_DIR = Path("data")  # relative to the working directory, as torchvision's examples
ENV_VAR = "FEDLEARN_DATA"

_IDX_STEMS = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
# md5 of the *uncompressed* official train-labels files: used only to notice a
# folder that holds the other one of the two look-alike datasets.
_TRAIN_LABEL_MD5 = {
    "mnist": "a25bea736e30d166cdddb491f175f624",
    "fashion_mnist": "9018921c3c673c538a1fc5bad174d6f9",
}
_SUBDIRS = {
    "mnist": ("mnist", "MNIST/raw"),
    "fashion_mnist": ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw"),
    "cifar10": ("cifar10",),
    "cifar100": ("cifar100",),
}
_TORCHVISION_RAW = {"mnist": "MNIST/raw", "fashion_mnist": "FashionMNIST/raw"}


def _download_root(root) -> Path:
    if root is not None:
        return Path(root).expanduser().absolute()
    env = os.environ.get(ENV_VAR)
    return (Path(env).expanduser() if env else Path(_DEFAULT_DOWNLOAD_DIR)).absolute()


def _search_dirs(name: str, root) -> list[Path]:
    """Folders searched for ``name``, in order."""
    bases = []
    if root is not None:
        bases.append(Path(root).expanduser().absolute())
    env = os.environ.get(ENV_VAR)
    if env:
        bases.append(Path(env).expanduser().absolute())
    default = Path(_DEFAULT_DOWNLOAD_DIR).absolute()
    dirs: list[Path] = []
    for base in bases:
        dirs.append(base)
        dirs.extend(base / sub for sub in _SUBDIRS[name])
    if name == "mnist":
        dirs.append(_SHARED_MNIST_DIR)
    elif name == "fashion_mnist":
        dirs.append(_DEBIAN_FASHION_DIR)
    if name in _TORCHVISION_RAW:
        dirs.append(default / _TORCHVISION_RAW[name])
    else:
        dirs.append(default)
    out, seen = [], set()
    for d in dirs:
        key = str(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


# --------------------------------------------------------------------------- #
# IDX files (MNIST, Fashion-MNIST)
# --------------------------------------------------------------------------- #
_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return f.read()


def read_idx(path) -> np.ndarray:
    """Read one IDX file (the MNIST format), gzipped or not, with NumPy only.

    Format: 2 zero bytes, a type code (0x08 = uint8, 0x09 int8, 0x0B int16,
    0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions d, then d
    big-endian uint32 sizes, then the data in C order.

    Parameters
    ----------
    path : str or Path
        File name; gzip is detected from the content, not the suffix.

    Returns
    -------
    ndarray of shape given by the header (native byte order).

    Examples
    --------
    >>> x = read_idx("train-images-idx3-ubyte.gz")  # doctest: +SKIP
    >>> x.shape, x.dtype  # doctest: +SKIP
    ((60000, 28, 28), dtype('uint8'))
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {data[:4]!r}).")
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header.")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(shape)) if shape else 1
    if len(data) - header != count * dtype.itemsize:
        raise ValueError(
            f"{path}: header says {shape} x {dtype.itemsize} bytes, "
            f"but the file holds {len(data) - header} bytes of data."
        )
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _find_idx_files(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The IDX files present in ``folder`` (preferring uncompressed) and the missing roles."""
    found, missing = {}, []
    for role, stems in _IDX_STEMS.items():
        for stem in stems:
            hit = next((folder / (stem + ext) for ext in ("", ".gz") if (folder / (stem + ext)).is_file()), None)
            if hit is not None:
                found[role] = hit
                break
        else:
            missing.append(stems[0])
    return found, missing


def _stamp(p: Path) -> tuple:
    st = p.stat()
    return (str(p.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_idx_set(stamps: tuple) -> tuple[np.ndarray, ...]:
    arrays = tuple(read_idx(s[0]) for s in stamps)
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _locate_idx(name: str, root) -> tuple[Path | None, list[str]]:
    notes = []
    other = "fashion_mnist" if name == "mnist" else "mnist"
    for folder in _search_dirs(name, root):
        if not folder.is_dir():
            notes.append(f"  {folder}  (no such folder)")
            continue
        found, missing = _find_idx_files(folder)
        if missing:
            what = "no IDX files" if not found else "missing " + ", ".join(missing)
            notes.append(f"  {folder}  ({what})")
            continue
        md5 = hashlib.md5(_read_bytes(found["train_labels"])).hexdigest()
        if md5 == _TRAIN_LABEL_MD5[other]:
            notes.append(f"  {folder}  (holds {other}, not {name})")
            continue
        return folder, notes
    return None, notes


def _load_idx_dataset(name: str, root, download: bool):
    folder, notes = _locate_idx(name, root)
    if folder is None and download:
        from torchvision import datasets as tvd

        cls = tvd.MNIST if name == "mnist" else tvd.FashionMNIST
        dl_root = _download_root(root)
        for train in (True, False):
            cls(str(dl_root), train=train, download=True)
        candidate = dl_root / _TORCHVISION_RAW[name]
        if not _find_idx_files(candidate)[1]:
            folder = candidate
        else:
            notes.append(f"  {candidate}  (torchvision download left no complete IDX set)")
    if folder is None:
        fixes = []
        if name == "fashion_mnist":
            fixes.append(
                "sudo apt-get install dataset-fashion-mnist   (Debian/Ubuntu, no internet needed "
                "beyond the package mirror; installs /usr/share/datasets/fashion-mnist)"
            )
        fixes += [
            f'load_dataset("{name}", download=True)   (downloads with torchvision into {_download_root(root)})',
            f"put the four files ({', '.join(s[0] for s in _IDX_STEMS.values())}, .gz or not) "
            f"in a folder and pass root=that_folder or set {ENV_VAR}=that_folder",
        ]
        raise FileNotFoundError(
            f"Could not find the {name} IDX files. Looked in, in this order:\n"
            + "\n".join(notes)
            + "\nTo fix, do one of:\n"
            + "\n".join(f"  - {f}" for f in fixes)
        )
    found, _ = _find_idx_files(folder)
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
# CIFAR (python pickle batches)
# --------------------------------------------------------------------------- #
_CIFAR_LAYOUT = {
    # name: (folder, train files, test files, label key)
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels"),
}


def _read_cifar_batches(files: list[Path], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for f in files:
        with open(f, "rb") as fh:
            entry = pickle.load(fh, encoding="latin1")  # the official files are python-2 pickles
        if "data" not in entry or label_key not in entry:
            raise ValueError(f"{f}: not a CIFAR batch (keys {sorted(entry)}; need 'data' and {label_key!r}).")
        data = np.asarray(entry["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072:
            raise ValueError(f"{f}: 'data' has shape {data.shape}, expected [n, 3072].")
        xs.append(data.reshape(-1, 3, 32, 32))  # stored as R plane, G plane, B plane
        ys.append(np.asarray(entry[label_key], dtype=np.int64))
        if ys[-1].shape != (data.shape[0],):
            raise ValueError(f"{f}: {len(ys[-1])} labels for {data.shape[0]} images.")
    return np.concatenate(xs), np.concatenate(ys)


def _locate_cifar(name: str, root) -> tuple[Path | None, list[str]]:
    folder_name, train_files, test_files, _ = _CIFAR_LAYOUT[name]
    notes = []
    for base in _search_dirs(name, root):
        folder = base if base.name == folder_name else base / folder_name
        if not folder.is_dir():
            notes.append(f"  {folder}  (no such folder)")
            continue
        missing = [f for f in train_files + test_files if not (folder / f).is_file()]
        if missing:
            notes.append(f"  {folder}  (missing {', '.join(missing)})")
            continue
        return folder, notes
    return None, notes


def _load_cifar(name: str, root, download: bool):
    folder_name, train_files, test_files, label_key = _CIFAR_LAYOUT[name]
    folder, notes = _locate_cifar(name, root)
    if folder is None and download:
        from torchvision import datasets as tvd

        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        dl_root = _download_root(root)
        cls(str(dl_root), train=True, download=True)  # downloads, checks md5, extracts
        folder = dl_root / folder_name
    if folder is None:
        raise FileNotFoundError(
            f"Could not find {name} ({folder_name}/ with {', '.join(train_files + test_files)}). "
            "Looked in, in this order:\n" + "\n".join(notes) + "\nTo fix, do one of:\n"
            f'  - load_dataset("{name}", download=True)   (needs internet; downloads with torchvision '
            f"into {_download_root(root) / folder_name})\n"
            f"  - extract the official python archive so that {folder_name}/ sits in a folder, and pass "
            f"root=that_folder or set {ENV_VAR}=that_folder"
        )
    num_classes = DATASETS[name].num_classes
    out = []
    for files in (train_files, test_files):
        x, y = _read_cifar_batches([folder / f for f in files], label_key)
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

    Parameters
    ----------
    name : {"digits", "mnist", "fashion_mnist", "cifar10", "cifar100"}
        ``"digits"`` (scikit-learn's bundled 8x8 digits) needs no files and is
        the offline default. Case and ``-``/``_`` do not matter.
    root : str or Path, optional
        Folder searched first (see the module docstring for the full order);
        also where ``download=True`` puts files (default ``$FEDLEARN_DATA``,
        else ``./data``).
    download : bool, default=False
        If the files are found nowhere, download them with torchvision.
        Files already present are always used as they are.

    Returns
    -------
    train, test : TensorDataset
        ``tensors[0]``: float32 inputs in ``[0, 1]`` of shape ``[n, C, H, W]``
        (``[n, 1, 8, 8]`` digits, ``[n, 1, 28, 28]`` MNIST / Fashion-MNIST,
        ``[n, 3, 32, 32]`` CIFAR); ``tensors[1]``: int64 labels ``[n]``.
        Digits: a fixed stratified 80/20 split (``random_state=0``), 1,437 /
        360 images. The others: the official splits.

    Raises
    ------
    ValueError
        Unknown ``name`` (the message lists the valid names).
    FileNotFoundError
        Files not found and ``download=False``; the message lists every
        place looked at and the command that fixes it.

    Notes
    -----
    MNIST and Fashion-MNIST are read by :func:`read_idx`. CIFAR is read from
    the python pickle batches directly rather than through
    ``torchvision.datasets.CIFAR10(download=False)``, which insists on the
    official md5 sums of every batch; the md5s are checked by torchvision when
    it downloads. Only open pickle files you trust.

    Examples
    --------
    >>> train, test = load_dataset("digits")
    >>> train.tensors[0].shape, test.tensors[0].shape
    (torch.Size([1437, 1, 8, 8]), torch.Size([360, 1, 8, 8]))
    """
    key = _canonical(name)
    if key == "digits":
        return _load_digits()
    if key in ("mnist", "fashion_mnist"):
        return _load_idx_dataset(key, root, download)
    return _load_cifar(key, root, download)


# --------------------------------------------------------------------------- #
# federated datasets
# --------------------------------------------------------------------------- #
PARTITIONS = ("iid", "dirichlet", "shards", "quantity")


def random_subset(x: Tensor, y: Tensor, num_samples, seed: int, source: str) -> tuple[Tensor, Tensor]:
    """A seeded random subset of ``num_samples`` samples, kept in their original order.

    ``source`` names where the samples come from, for the error when too many are asked for.
    """
    k = _check_int(num_samples, "num_samples", 1)
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

    Parameters
    ----------
    name : str, default="digits"
        Any name :func:`load_dataset` accepts.
    partition : {"iid", "dirichlet", "shards", "quantity"}, default="dirichlet"
        :func:`iid_partition`, :func:`dirichlet_partition` (uses ``alpha``,
        ``min_size``), :func:`shard_partition` (uses ``shards_per_client``) or
        :func:`quantity_skew_partition` (uses ``sigma``, ``min_size``).
    num_clients : int, default=20
    alpha : float, default=0.1
        Dirichlet concentration (only for ``"dirichlet"``).
    shards_per_client : int, default=2
    sigma : float, default=1.0
        Log-normal spread of client sizes (only for ``"quantity"``).
    min_size : int, default=10
        Least samples per client before the local train/test split.
    test_fraction : float, default=0.2
        Share of each client's samples kept as its local test split.
    seed : int, default=0
        Seeds the subset, the partition and the local splits.
    root, download
        Passed to :func:`load_dataset`.
    merge : bool, default=True
        Partition train+test together. With ``False`` only the official train
        split is partitioned; get the untouched official test split with
        ``load_dataset(name)[1]`` (e.g. as a global test set).
    num_samples : int, optional
        Use only a random subset of this many samples (quick CPU runs).

    Returns
    -------
    Federation
        ``num_clients`` clients; ``federation.name`` describes the setting.

    Examples
    --------
    >>> fed = federated_dataset("digits", "dirichlet", num_clients=10, alpha=0.5, seed=0)
    >>> fed.num_clients, fed.input_shape, fed.num_classes
    (10, (1, 8, 8), 10)
    """
    info = dataset_info(name)
    if partition not in PARTITIONS:
        raise ValueError(f"Unknown partition {partition!r}. Valid values: {', '.join(PARTITIONS)}.")
    k = _check_int(num_clients, "num_clients", 1)
    test_fraction = _check_float(test_fraction, "test_fraction", nonnegative=True)
    train, test = load_dataset(info.name, root=root, download=download)
    if merge:
        x = torch.cat([train.tensors[0], test.tensors[0]])
        y = torch.cat([train.tensors[1], test.tensors[1]])
    else:
        x, y = train.tensors
    if num_samples is not None:
        x, y = random_subset(x, y, num_samples, seed, "available")
    labels = y.numpy()
    if partition == "iid":
        parts = iid_partition(labels, k, seed=seed)
        desc = "IID"
    elif partition == "dirichlet":
        parts = dirichlet_partition(labels, k, alpha, min_size=min_size, seed=seed)
        desc = f"Dirichlet alpha={alpha:g}"
    elif partition == "shards":
        parts = shard_partition(labels, k, shards_per_client=shards_per_client, seed=seed)
        desc = f"{shards_per_client} shards/client"
    else:
        parts = quantity_skew_partition(labels, k, sigma=sigma, min_size=min_size, seed=seed)
        desc = f"quantity skew sigma={sigma:g}"
    return make_federation(
        x,
        y,
        parts,
        test_fraction=test_fraction,
        num_classes=info.num_classes,
        seed=seed,
        name=f"{info.name}, {desc}, {k} clients",
    )

"""Where dataset files are looked for, in order, and what is trusted there.

Nothing here knows about any folder beside the repository: the places are the
``root`` the caller passes, the folder named by the environment variable
``FEDLEARN_DATA``, the Debian package's folder for Fashion-MNIST and, for the IDX
datasets only, torchvision's default download folder ``./data``. CIFAR is looked for
only where the caller points (``root`` or ``FEDLEARN_DATA``), never in the working
directory: its files are pickles, and although they are read with a restricted
unpickler (:class:`~fedlearn_edu.data.readers.SafeUnpickler`), a folder the user did
not name is not read at all.

Downloads (``download=True``) go through torchvision; setting the environment variable
``FEDLEARN_OFFLINE=1`` turns them off, so that a loader asked to download fails at once
with the list of places it looked, as on a machine without a network (the book build the
tests run sets it: every chapter is built on its fallback, as a newcomer's offline build).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .readers import read_bytes

__all__ = [
    "ENV_VAR",
    "OFFLINE_VAR",
    "REQUEST_LOG_VAR",
    "downloads_allowed",
    "log_request",
    "search_dirs",
    "download_root",
    "find_idx_files",
    "locate_idx",
    "locate_cifar",
    "CIFAR_LAYOUT",
]

ENV_VAR = "FEDLEARN_DATA"
OFFLINE_VAR = "FEDLEARN_OFFLINE"  # "1" (any value but "" and "0"): never download
# A file: every request for a data set that is not bundled is appended to it (see log_request).
REQUEST_LOG_VAR = "FEDLEARN_DATA_LOG"
# Module-level so tests (and users with unusual layouts) can point them elsewhere.
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_DOWNLOAD_DIR = Path("data")  # relative to the working directory, as torchvision's examples

IDX_STEMS = {
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
TORCHVISION_RAW = {"mnist": "MNIST/raw", "fashion_mnist": "FashionMNIST/raw"}
CIFAR_LAYOUT = {
    # name: (folder, train files, test files, label key)
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels"),
}


def downloads_allowed() -> bool:
    """``False`` when ``$FEDLEARN_OFFLINE`` is set to anything but ``""`` or ``"0"``: ``download=True`` is then ignored.

    Example:
        >>> import os
        >>> downloads_allowed() == (os.environ.get("FEDLEARN_OFFLINE", "") in ("", "0"))
        True
    """
    return os.environ.get(OFFLINE_VAR, "") in ("", "0")


def log_request(name: str, found: bool) -> None:
    """Append ``{"dataset": name, "found": found}`` to the file ``$FEDLEARN_DATA_LOG`` names, if it is set.

    The book build sets it for each page it executes (``book/_ext/fedlearn_book.py``), so the tests
    know which chapters asked for a data set that the newcomer's offline build lacked, and execute
    only those again with the data (``tests/book/test_reader_copies.py``). Unset, nothing is written.

    Args:
        name: the data set's canonical name, e.g. ``"mnist"``.
        found: whether its files were found (or downloaded).
    """
    path = os.environ.get(REQUEST_LOG_VAR, "")
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"dataset": name, "found": bool(found)}) + "\n")


def download_root(root) -> Path:
    """Where ``download=True`` puts files: ``root``, else ``$FEDLEARN_DATA``, else ``./data``.

    Args:
        root: the caller's folder, or ``None``.

    Returns:
        An absolute ``Path``.
    """
    if root is not None:
        return Path(root).expanduser().absolute()
    env = os.environ.get(ENV_VAR)
    return (Path(env).expanduser() if env else Path(DEFAULT_DOWNLOAD_DIR)).absolute()


def search_dirs(name: str, root) -> list[Path]:
    """The folders searched for dataset ``name``, in order.

    Args:
        name: canonical dataset name (``"mnist"``, ``"fashion_mnist"``, ``"cifar10"``, ``"cifar100"``).
        root: the caller's folder, or ``None``.

    Returns:
        ``root`` and ``$FEDLEARN_DATA`` with their conventional subfolders; then, for
        Fashion-MNIST, the Debian package's folder; for the IDX datasets, torchvision's
        default download folder ``./data/<Name>/raw``. CIFAR: only the first two.
    """
    bases = []
    if root is not None:
        bases.append(Path(root).expanduser().absolute())
    env = os.environ.get(ENV_VAR)
    if env:
        bases.append(Path(env).expanduser().absolute())
    dirs: list[Path] = []
    for base in bases:
        dirs.append(base)
        dirs.extend(base / sub for sub in _SUBDIRS[name])
    if name == "fashion_mnist":
        dirs.append(DEBIAN_FASHION_DIR)
    if name in TORCHVISION_RAW:
        dirs.append(Path(DEFAULT_DOWNLOAD_DIR).absolute() / TORCHVISION_RAW[name])
    out, seen = [], set()
    for d in dirs:
        if str(d) not in seen:
            seen.add(str(d))
            out.append(d)
    return out


def find_idx_files(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The IDX files present in ``folder`` (preferring uncompressed) and the missing roles.

    Args:
        folder: a folder that may hold the four IDX files.

    Returns:
        ``(found, missing)``: ``{role: path}`` and the file stems not found.
    """
    found, missing = {}, []
    for role, stems in IDX_STEMS.items():
        for stem in stems:
            hit = next((folder / (stem + ext) for ext in ("", ".gz") if (folder / (stem + ext)).is_file()), None)
            if hit is not None:
                found[role] = hit
                break
        else:
            missing.append(stems[0])
    return found, missing


def locate_idx(name: str, root) -> tuple[Path | None, list[str]]:
    """The first folder holding a complete IDX set of ``name`` (not of its look-alike).

    Args:
        name: canonical dataset name (``"mnist"`` or ``"fashion_mnist"``).
        root: the caller's folder, or ``None``.

    Returns:
        ``(folder or None, notes)``: one note per folder passed over, saying why.
    """
    notes = []
    other = "fashion_mnist" if name == "mnist" else "mnist"
    for folder in search_dirs(name, root):
        if not folder.is_dir():
            notes.append(f"  {folder}  (no such folder)")
            continue
        found, missing = find_idx_files(folder)
        if missing:
            what = "no IDX files" if not found else "missing " + ", ".join(missing)
            notes.append(f"  {folder}  ({what})")
            continue
        md5 = hashlib.md5(read_bytes(found["train_labels"])).hexdigest()
        if md5 == _TRAIN_LABEL_MD5[other]:
            notes.append(f"  {folder}  (holds {other}, not {name})")
            continue
        return folder, notes
    return None, notes


def locate_cifar(name: str, root) -> tuple[Path | None, list[str]]:
    """The first ``cifar-10-batches-py``/``cifar-100-python`` folder below ``root`` or ``$FEDLEARN_DATA``.

    Args:
        name: ``"cifar10"`` or ``"cifar100"``.
        root: the caller's folder, or ``None``.

    Returns:
        ``(folder or None, notes)``: one note per folder passed over, saying why.
    """
    folder_name, train_files, test_files, _ = CIFAR_LAYOUT[name]
    notes = []
    for base in search_dirs(name, root):
        folder = base if base.name == folder_name else base / folder_name
        if not folder.is_dir():
            notes.append(f"  {folder}  (no such folder)")
            continue
        missing = [f for f in train_files + test_files if not (folder / f).is_file()]
        if missing:
            notes.append(f"  {folder}  (missing {', '.join(missing)})")
            continue
        return folder, notes
    if not notes:
        notes.append(f"  (nowhere: pass root=... or set {ENV_VAR}; CIFAR is never read from a folder you did not name)")
    return None, notes

"""Readers of the on-disk dataset formats: IDX (MNIST, Fashion-MNIST) and CIFAR's python batches.

Both parse files without running anything stored in them. IDX is a plain binary
format read with NumPy. CIFAR's "python version" batches are pickles; they are read
with :class:`SafeUnpickler`, which builds only plain data (dicts, lists, strings,
numbers) and NumPy arrays and refuses every other object a pickle may name, so a
crafted file raises ``ValueError`` instead of executing code.
"""

from __future__ import annotations

import gzip
import importlib
import io
import pickle
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "read_cifar_batches", "SafeUnpickler"]

_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, gunzipped when the content starts with gzip's magic number.

    Args:
        path: the file.

    Returns:
        Its (decompressed) bytes.
    """
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

    Args:
        path: file name (str or Path); gzip is detected from the content, not the suffix.

    Returns:
        ``ndarray`` of the shape given by the header, in native byte order.

    Raises:
        ValueError: not an IDX file, or a header that does not match the data.

    Example:
        >>> x = read_idx("train-images-idx3-ubyte.gz")  # doctest: +SKIP
        >>> x.shape, x.dtype  # doctest: +SKIP
        ((60000, 28, 28), dtype('uint8'))
    """
    path = Path(path)
    data = read_bytes(path)
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


def _multiarray():
    try:
        return importlib.import_module("numpy._core.multiarray")
    except ImportError:  # NumPy < 2
        return importlib.import_module("numpy.core.multiarray")


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that can build NumPy arrays and plain data, and nothing else.

    A pickle names the callables that rebuild its objects; the standard unpickler
    imports and calls whatever is named (``os.system`` included). This one allows only
    what a NumPy array's pickle needs (``ndarray``, ``dtype``, ``_reconstruct``, and
    ``_codecs.encode`` for byte strings written by Python 3) and raises
    ``pickle.UnpicklingError`` for anything else.
    """

    _ALLOWED = {
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): lambda: _multiarray()._reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): lambda: _multiarray()._reconstruct,
        ("_codecs", "encode"): lambda: __import__("codecs").encode,
    }

    def find_class(self, module: str, name: str):
        """The allowed global ``module.name``; anything else is refused (nothing is executed from data).

        Args:
            module: the global's module, as the pickle names it.
            name: the global's name.

        Returns:
            The allowed object.

        Raises:
            pickle.UnpicklingError: any global not on the allow-list.
        """
        make = self._ALLOWED.get((module, name))
        if make is None:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: CIFAR batches hold only arrays and lists")
        return make()


def _safe_load(path: Path) -> dict:
    try:
        entry = SafeUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise ValueError(f"{path}: not a CIFAR batch ({err}).") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: not a CIFAR batch (holds a {type(entry).__name__}, not a dict).")
    return entry


def read_cifar_batches(files: list[Path], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Read CIFAR python batches (pickled dicts) without running code from them.

    Args:
        files: the batch files, e.g. ``data_batch_1`` ... ``data_batch_5``.
        label_key: ``"labels"`` (CIFAR-10) or ``"fine_labels"`` (CIFAR-100).

    Returns:
        ``(x, y)``: ``ndarray[n, 3, 32, 32]`` uint8 images and ``ndarray[n]`` int64 labels.

    Raises:
        ValueError: a file that is not a CIFAR batch, or one that names anything other
            than arrays and plain data (see ``SafeUnpickler`` in this module).
    """
    xs, ys = [], []
    for f in files:
        entry = _safe_load(Path(f))
        if "data" not in entry or label_key not in entry:
            raise ValueError(f"{f}: not a CIFAR batch (keys {sorted(entry)}; need 'data' and {label_key!r}).")
        if isinstance(entry["data"], np.ndarray) and entry["data"].dtype == object:
            raise ValueError(f"{f}: 'data' holds Python objects, not pixel values.")
        data = np.asarray(entry["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072:
            raise ValueError(f"{f}: 'data' has shape {data.shape}, expected [n, 3072].")
        xs.append(data.reshape(-1, 3, 32, 32))  # stored as R plane, G plane, B plane
        ys.append(np.asarray(entry[label_key], dtype=np.int64))
        if ys[-1].shape != (data.shape[0],):
            raise ValueError(f"{f}: {len(ys[-1])} labels for {data.shape[0]} images.")
    return np.concatenate(xs), np.concatenate(ys)

"""Small shared helpers: device choice, seed derivation and the CPU allocator setting."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import torch

from .checks import check_int

__all__ = ["resolve_device", "derive_seed", "tune_cpu_allocator"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn ``"auto"`` into CUDA, then MPS, then CPU; pass anything else to ``torch.device``.

    Args:
        device: ``"auto"``, a device name (``"cpu"``, ``"cuda:0"``, ...) or a ``torch.device``.

    Returns:
        The ``torch.device``.

    Raises:
        TypeError: a bool (``True`` is not a device; an int is a CUDA ordinal, as in torch).
        ValueError: an unknown device name, or a device not available on this machine.
    """
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool):
        raise TypeError(f"device must be 'auto', a device name such as 'cpu' or a torch.device, got {device!r}.")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:1', 'mps' ({err}).") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available; use device='auto' or 'cpu'.")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device='mps' was requested but MPS is not available; use device='auto' or 'cpu'.")
    if dev.type == "meta":
        raise ValueError("device='meta' holds shapes, not values: a simulation cannot run on it; use 'auto' or 'cpu'.")
    return dev


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys, e.g. ``derive_seed(seed, round, client)``.

    Different key tuples give statistically independent streams (NumPy's SeedSequence),
    so a client's data order depends only on (seed, round, client id), never on which
    other clients were selected or which engine trains it.

    Args:
        *keys: non-negative integers.

    Returns:
        An int in ``[0, 2**63)``.

    Raises:
        TypeError: a key that is not an integer (``1.7`` is not truncated to ``1``).
        ValueError: a negative key.
    """
    checked = [check_int(k, f"derive_seed's key {i}", 0) for i, k in enumerate(keys)]
    state = np.random.SeedSequence(checked).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


_ALLOCATOR_TUNED: bool | None = None


def tune_cpu_allocator(mmap_threshold: int = 32 * 2**20, trim_threshold: int = 2**30, heap_only: bool = True) -> bool:
    """Let glibc keep freed tensor memory for reuse instead of handing it back to the OS.

    By default glibc returns large freed blocks to the operating system at once, so a
    training step that allocates the same tensors again pays a page fault for every 4 KiB
    of them. Batched client training allocates tensors of ``m x`` the model size every
    step, and on this project's 2-core test machine that cost 30-40 % of a vectorised
    round (``benchmarks/engine.py`` prints rounds with and without this setting).

    This calls ``mallopt``: blocks up to ``mmap_threshold`` bytes come from the heap (glibc
    refuses more than 32 MiB on 64-bit systems), and up to ``trim_threshold`` free bytes
    stay in the process. With ``heap_only`` (``M_MMAP_MAX = 0``) larger blocks come from the
    heap too: a stacked tensor of 1,000 digits MLPs, or of 100 MNIST MLPs, is 40-200 MB,
    and glibc would map every such allocation afresh. Measured on the 2-core machine: 1.5-1.7x
    faster rounds at N = 1,000 (digits) and 1.2-1.6x at N = 100 (MNIST), bitwise the same
    results, peak memory 7-17 % higher. It is process-wide and
    harmless to tensors; it only changes when memory goes back to the OS. Called once by
    :class:`~fedlearn_edu.engine.VmapEngine` on the CPU (``VmapEngine(tune_allocator=False)``
    leaves the allocator alone); later calls do nothing.

    Args:
        mmap_threshold: bytes above which glibc maps blocks directly (at most 32 MiB).
        trim_threshold: free bytes kept in the process before trimming.
        heap_only: also serve blocks above ``mmap_threshold`` from the heap (``M_MMAP_MAX = 0``).

    Returns:
        ``True`` when the setting is in effect (Linux with glibc), ``False`` elsewhere
        (macOS, Windows, musl), where nothing is changed.

    Raises:
        ValueError: a threshold that is not a whole number of bytes in (0, 2**31).
    """
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if int(value) != value or not 0 < value < 2**31:
            raise ValueError(f"{name} must be a whole number of bytes in (0, 2**31), got {value}.")
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED is None:
        _ALLOCATOR_TUNED = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL("libc.so.6")
                m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4  # from glibc's malloc.h
                _ALLOCATOR_TUNED = bool(
                    libc.mallopt(m_mmap_threshold, int(mmap_threshold))
                    and libc.mallopt(m_trim_threshold, int(trim_threshold))
                    and (not heap_only or libc.mallopt(m_mmap_max, 0))
                )
            except (OSError, AttributeError):
                pass
    return _ALLOCATOR_TUNED

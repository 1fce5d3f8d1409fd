"""Wall-time helpers shared by the benchmark scripts (run as ``python benchmarks/<script>.py``)."""

from __future__ import annotations

import time

import torch


def elapsed(fn, device: torch.device | str = "cpu") -> float:
    """Seconds one call of ``fn()`` takes; on CUDA the device is synchronised before and after,
    so the time covers the kernels."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def best_of(fn, repeats: int, device: torch.device | str = "cpu") -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn()`` (see :func:`elapsed`), after one warm-up call."""
    fn()
    return min(elapsed(fn, device) for _ in range(repeats))


def status_mib(field: str) -> float:
    """A memory figure of this process from ``/proc/self/status`` (``"VmRSS"``, ``"VmHWM"``), in MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")

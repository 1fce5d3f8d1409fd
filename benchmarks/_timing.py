"""Best-of-k wall time shared by the benchmark scripts (run as ``python benchmarks/<script>.py``)."""
from __future__ import annotations

import time

import torch


def best_of(fn, repeats: int, device: torch.device | str = "cpu") -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn()``, after one warm-up call.

    On CUDA the device is synchronised around every call, so the time covers the kernels.
    """
    device = torch.device(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)

"""Small shared helpers: device choice and seed derivation."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["resolve_device", "derive_seed"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn ``"auto"`` into CUDA, then MPS, then CPU; pass anything else to ``torch.device``.

    Raises:
        ValueError: the named device is not available on this machine.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available; use device='auto' or 'cpu'.")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device='mps' was requested but MPS is not available; use device='auto' or 'cpu'.")
    return dev


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys, e.g. ``derive_seed(seed, round, client)``.

    Different key tuples give statistically independent streams (NumPy's SeedSequence),
    so a client's data order depends only on (seed, round, client id), never on which
    other clients were selected or which engine trains it.
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)

"""Helpers shared by the baselines' pure functions: leaf-wise maps and argument checks.

Client quantities are ``Tensor[m, d]`` or dicts of ``Tensor[m, ...]`` (``Updates``); server
quantities have the same structure without the client axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from numbers import Real

import torch
from torch import Tensor

from ._checks import Updates, check_updates


def map_updates(fn: Callable[..., Tensor], *trees: Updates) -> Updates:
    """``fn`` applied leaf-wise: ``fn(t1, t2, ...)`` for tensors, ``{k: fn(t1[k], t2[k], ...)}`` for dicts."""
    if isinstance(trees[0], Tensor):
        return fn(*trees)
    return {k: fn(*(t[k] for t in trees)) for k in trees[0]}


def check_stacked_like(x: Updates, like: Updates, what: str, like_what: str) -> None:
    """``x`` must be finite and have exactly ``like``'s structure and shapes (client axis included)."""
    check_updates(x, what)
    if isinstance(like, Tensor):
        if not isinstance(x, Tensor) or x.shape != like.shape:
            shape = tuple(x.shape) if isinstance(x, Tensor) else "a dict"
            raise ValueError(f"{what} must have the shape of {like_what}, {tuple(like.shape)}; got {shape}.")
        return
    if not isinstance(x, Mapping) or set(x) != set(like):
        raise ValueError(f"{what} must be a dict with the keys of {like_what} ({sorted(like)[:6]}...).")
    for k, v in like.items():
        if x[k].shape != v.shape:
            raise ValueError(
                f"{what}[{k!r}] must have shape {tuple(v.shape)} like {like_what}; got {tuple(x[k].shape)}."
            )


def check_counts(values, m: int, what: str) -> Tensor:
    """A number or ``Tensor[m]`` of finite values > 0 (local step counts), as float64 ``Tensor[m]``."""
    t = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    if t.dim() == 0:
        t = t.expand(m).clone()
    if t.shape != (m,):
        raise ValueError(f"{what} must be a number or Tensor[m] with m = {m} (one per client); got {tuple(t.shape)}.")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"{what} must be finite and > 0; got {t.tolist()}.")
    return t


def check_positive(value, what: str, allow_zero: bool = False) -> float:
    """A finite real number > 0 (>= 0 with ``allow_zero``)."""
    number = isinstance(value, Real) or (isinstance(value, Tensor) and value.numel() == 1)
    if isinstance(value, bool) or not number:
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}.")
    v = float(value)
    ok = v >= 0 if allow_zero else v > 0
    if not (ok and math.isfinite(v)):
        raise ValueError(f"{what} must be a finite number {'>=' if allow_zero else '>'} 0, got {v}.")
    return v


def check_num_clients(num_clients, m: int) -> int:
    """The federation's size N: an int with N >= m (the selected clients are among the N)."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, int):
        raise TypeError(f"num_clients must be an int (N, all clients of the federation), got {num_clients!r}.")
    if num_clients < m:
        raise ValueError(f"num_clients = {num_clients} is smaller than the {m} selected clients.")
    return num_clients

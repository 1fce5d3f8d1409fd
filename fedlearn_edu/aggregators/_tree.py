"""Helpers shared by the baselines' pure functions: leaf-wise maps and combinations.

Client quantities are ``Tensor[m, d]`` or dicts of ``Tensor[m, ...]`` (``Updates``); server
quantities have the same structure without the client axis.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..checks import Updates


def map_updates(fn: Callable[..., Tensor], *trees: Updates) -> Updates:
    """``fn`` applied leaf-wise: ``fn(t1, t2, ...)`` for tensors, ``{k: fn(t1[k], t2[k], ...)}`` for dicts.

    Args:
        fn: a function of as many tensors as there are trees.
        *trees: tensors, or dicts of tensors with the first one's keys.

    Returns:
        ``fn``'s result, in the trees' structure (a tensor, or a dict with the first tree's keys).
    """
    if isinstance(trees[0], Tensor):
        return fn(*trees)
    return {k: fn(*(t[k] for t in trees)) for k in trees[0]}


def combine(coef: Tensor, pseudo_grads: Updates) -> Updates:
    """``sum_k coef_k g_k`` for ``coef: Tensor[m]``, in the input's structure and dtype.

    Args:
        coef: ``Tensor[m]``, one coefficient per client.
        pseudo_grads: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.

    Returns:
        ``Tensor[d]`` or ``{name: Tensor[...]}``, in each tensor's dtype.
    """

    def one(t: Tensor) -> Tensor:
        return torch.tensordot(
            coef.to(device=t.device, dtype=torch.promote_types(t.dtype, coef.dtype)),
            t.to(torch.promote_types(t.dtype, coef.dtype)),
            dims=1,
        ).to(t.dtype)

    if isinstance(pseudo_grads, Tensor):
        return one(pseudo_grads)
    return {k: one(v) for k, v in pseudo_grads.items()}

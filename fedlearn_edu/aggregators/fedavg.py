"""FedAvg's weighted mean and the conflict count: pure functions of stacked client tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import Updates, check_finite, check_updates, check_weights

__all__ = ["fedavg", "count_conflicts"]


def fedavg(deltas: Updates, weights, *, check: bool = True) -> Updates:
    """Weighted mean of client updates: ``sum_i p_i * Delta_i`` with ``p = weights / sum(weights)``.

    With ``weights = n_i`` (training-set sizes of the selected clients) this is
    FedAvg's aggregate; the server then sets ``theta_{t+1} = theta_t + eta_s * result``.

    Args:
        deltas: client updates ``Delta_i = theta_i - theta_t``, either ``Tensor[m, d]``
            or a dict of per-layer ``Tensor[m, ...]`` (the stacked-parameter layout).
        weights: ``Tensor[m]`` non-negative weights (any positive scale; normalised here).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]``, or a dict of ``Tensor[...]`` with the input's keys.

    Example:
        >>> d = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> fedavg(d, torch.tensor([3.0, 1.0]))
        tensor([0.7500, 0.2500])
    """
    m = check_updates(deltas, "deltas", finite=check)
    w = check_weights(weights, m).to(torch.float64)
    w = w / w.max()  # a scale that cannot overflow the sum (weights near the float maximum)
    p = w / w.sum()

    def mean(t: Tensor) -> Tensor:
        return torch.tensordot(p.to(device=t.device, dtype=t.dtype), t, dims=1)

    if isinstance(deltas, Tensor):
        return mean(deltas)
    return {k: mean(v) for k, v in deltas.items()}


def count_conflicts(deltas: Updates, update: Updates, *, check: bool = True) -> dict:
    """How many clients' updates point against the applied update (negative inner product).

    Args:
        deltas: client updates ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        update: the applied global update ``theta_{t+1} - theta_t``, ``Tensor[d]`` or dict
            of ``Tensor[...]`` with the same keys.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``{"conflicts": int, "conflicts_per_layer": {group: int}}``. For a dict input,
        layers are grouped by module (weight and bias together); for a plain tensor the
        per-layer dict is empty.
    """
    from ..params import layer_groups

    m = check_updates(deltas, "deltas", finite=check)
    if not isinstance(update, (Tensor, dict)):
        raise TypeError(f"update must be a Tensor[d] or a dict of tensors, got {type(update).__name__}.")
    check_finite(update, "update")
    if isinstance(deltas, Tensor) != isinstance(update, Tensor) or (
        not isinstance(deltas, Tensor) and set(update) != set(deltas)
    ):
        raise ValueError("update must be shaped like one client's entry of deltas (a Tensor[d], or the same keys).")
    for k, u in {"": update}.items() if isinstance(update, Tensor) else update.items():
        d = deltas if isinstance(deltas, Tensor) else deltas[k]
        if not u.is_floating_point() or tuple(u.shape) != tuple(d.shape[1:]):
            raise ValueError(
                f"update{'[' + repr(k) + ']' if k else ''} must be a floating-point tensor shaped like one client's "
                f"row of deltas ({tuple(d.shape[1:])}); got {u.dtype} {tuple(u.shape)}."
            )
    if isinstance(deltas, Tensor):
        dtype = torch.promote_types(deltas.dtype, update.dtype)
        return {"conflicts": int((deltas.to(dtype) @ update.to(dtype) < 0).sum()), "conflicts_per_layer": {}}
    dots = {k: (v.reshape(m, -1) * update[k].reshape(1, -1)).sum(dim=1) for k, v in deltas.items()}
    per_layer = {}
    for group, names in layer_groups(list(deltas)).items():
        per_layer[group] = int((sum(dots[n] for n in names) < 0).sum())
    total = sum(dots.values())
    return {"conflicts": int((total < 0).sum()), "conflicts_per_layer": per_layer}

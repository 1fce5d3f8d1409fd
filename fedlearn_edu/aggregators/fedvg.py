"""FedVG's weights (Devkota et al., 2026): inverse validation-gradient norms.

Inputs are the norms ``||g_{k,l}||_p`` of the validation-loss gradient at each
client's model (client k, parameter tensor l), ``Tensor[m, L]``, as returned by
:func:`fedlearn_edu.signals.validation_gradient_norms`. Pure functions: no
models, no loops over clients, any device.

* clientwise:  ``G_k = sum_l ||g_{k,l}||``,  ``s_k = (1/(G_k + eps)) / sum_j 1/(G_j + eps)``
* layer-wise:  ``s_{k,l} = (1/(||g_{k,l}|| + eps)) / sum_j 1/(||g_{j,l}|| + eps)``  (one
  weight vector per parameter tensor)
* mixed:       ``(s_k + n_k / sum_j n_j) / 2``
* aggregate:   ``sum_k s_k Delta_k`` (clientwise) or, for tensor l, ``sum_k s_{k,l} Delta_{k,l}``;
  the server then sets ``theta_{t+1} = theta_t + eta_s * aggregate``.

Signs: the functions take client deltas ``Delta_k = theta_k - theta_t``; the
pseudo-gradient is ``g_k = -Delta_k``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..checks import as_tensor_arg, check_positive, check_updates, check_weights

__all__ = ["fedvg_weights", "fedvg_layerwise_weights", "fedvg_mixed_weights", "fedvg_aggregate"]


def _check_norms(grad_norms) -> Tensor:
    g = as_tensor_arg(grad_norms, "grad_norms")
    if not g.is_floating_point():
        g = g.to(torch.get_default_dtype())
    if g.dim() not in (1, 2):
        raise ValueError(
            "grad_norms must be Tensor[m, L] (client x parameter tensor) or Tensor[m] "
            f"(already summed per client); got shape {tuple(g.shape)}."
        )
    if g.shape[0] == 0:
        raise ValueError("grad_norms holds no clients (m = 0): select at least one client.")
    if g.dim() == 2 and g.shape[1] == 0:
        raise ValueError("grad_norms has no parameter tensors (L = 0).")
    rows = g.reshape(g.shape[0], -1)
    bad = ~torch.isfinite(rows).all(dim=1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"grad_norms: the validation-gradient norms of client {i} (row {i}) contain NaN or Inf: "
            f"{rows[i].tolist()}. Its model diverged; lower the client learning rate."
        )
    neg = (rows < 0).any(dim=1)
    if bool(neg.any()):
        i = int(neg.nonzero()[0])
        raise ValueError(f"grad_norms are >= 0, but row {i} (client {i}) has negative entries: {rows[i].tolist()}.")
    return g


def _check_eps(eps: float) -> float:
    return check_positive(eps, "eps")  # it keeps 1/(G + eps) finite


def fedvg_weights(grad_norms, eps: float = 1e-8) -> Tensor:
    """Clientwise FedVG weights: ``s_k ∝ 1 / (G_k + eps)`` with ``G_k = sum_l ||g_{k,l}||``.

    A client whose model sits where the validation loss is flat (small gradient) gets a
    large weight; the weights are positive and sum to one.

    Args:
        grad_norms: ``Tensor[m, L]`` norms per client and parameter tensor, or ``Tensor[m]``
            holding ``G_k`` directly.
        eps: added to ``G_k`` before inverting (1e-8 in the authors' code).

    Returns:
        ``Tensor[m]``, positive, summing to 1.

    Example:
        >>> fedvg_weights(torch.tensor([[1.0, 1.0], [3.0, 1.0]]))  # G = (2, 4)
        tensor([0.6667, 0.3333])
    """
    g = _check_norms(grad_norms)
    eps = _check_eps(eps)
    g64 = g.to(torch.float64)  # 1/(G + 1e-8) overflows float16 (and eps vanishes in it)
    G = g64.sum(dim=1) if g.dim() == 2 else g64
    inv = 1.0 / (G + eps)
    return (inv / inv.sum()).to(g.dtype)


def fedvg_layerwise_weights(grad_norms, eps: float = 1e-8) -> Tensor:
    """Layer-wise FedVG weights: one weight vector over clients per parameter tensor.

    ``s_{k,l} = (1/(||g_{k,l}|| + eps)) / sum_j (1/(||g_{j,l}|| + eps))``; every column sums to 1.

    Args:
        grad_norms: ``Tensor[m, L]``.
        eps: added to every norm before inverting.

    Returns:
        ``Tensor[m, L]``: column l weighs the clients' updates of parameter tensor l.

    Example:
        >>> fedvg_layerwise_weights(torch.tensor([[1.0, 1.0], [3.0, 1.0]]))
        tensor([[0.7500, 0.5000],
                [0.2500, 0.5000]])
    """
    g = _check_norms(grad_norms)
    if g.dim() != 2:
        raise ValueError(f"Layer-wise weights need grad_norms as Tensor[m, L]; got shape {tuple(g.shape)}.")
    eps = _check_eps(eps)
    inv = 1.0 / (g.to(torch.float64) + eps)
    return (inv / inv.sum(dim=0, keepdim=True)).to(g.dtype)


def fedvg_mixed_weights(weights, num_samples) -> Tensor:
    """The authors' mixed weight: the mean of FedVG's weight and FedAvg's size share.

    ``w_k = (s_k + n_k / sum_j n_j) / 2``; works column-wise for layer-wise weights.

    Args:
        weights: FedVG weights ``Tensor[m]`` or ``Tensor[m, L]`` (columns summing to 1).
        num_samples: ``Tensor[m]`` training-set sizes n_k.

    Returns:
        Same shape as ``weights``; sums to 1 (per column).

    Example:
        >>> fedvg_mixed_weights(torch.tensor([0.5, 0.5]), torch.tensor([30, 10]))
        tensor([0.6250, 0.3750])
    """
    s = as_tensor_arg(weights, "weights")
    if s.dim() not in (1, 2) or s.shape[0] == 0:
        raise ValueError(f"weights must be Tensor[m] or Tensor[m, L] with m >= 1; got shape {tuple(s.shape)}.")
    m = s.shape[0]
    n = check_weights(num_samples, m, "num_samples").to(device=s.device, dtype=s.dtype)
    if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
        raise ValueError(f"weights must be finite and >= 0; got {s.tolist()}.")
    p = n / n.sum()
    return (s + (p if s.dim() == 1 else p.unsqueeze(1))) / 2


def fedvg_aggregate(deltas: Mapping[str, Tensor], weights, *, check: bool = True) -> dict[str, Tensor]:
    """Weighted mean of client deltas with clientwise or layer-wise weights.

    * ``weights: Tensor[m]``: ``sum_k s_k Delta_k`` for every tensor;
    * ``weights: Tensor[m, L]``: tensor l (the l-th key of ``deltas``) gets
      ``sum_k s_{k,l} Delta_{k,l}``.

    The weights are used as given (FedVG's already sum to one; pass normalised weights).

    Args:
        deltas: stacked client updates ``{name: Tensor[m, ...]}``, ``Delta_k = theta_k - theta_t``.
        weights: ``Tensor[m]`` or ``Tensor[m, L]`` with L = ``len(deltas)``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``{name: Tensor[...]}``: the aggregated update (add it to theta_t).

    Example:
        >>> d = {"w": torch.tensor([[1.0], [3.0]]), "b": torch.tensor([[0.0], [4.0]])}
        >>> fedvg_aggregate(d, torch.tensor([[0.5, 0.75], [0.5, 0.25]]))
        {'w': tensor([2.]), 'b': tensor([1.])}
    """
    if isinstance(deltas, Tensor):
        raise TypeError("fedvg_aggregate takes the stacked dict {name: Tensor[m, ...]} of client deltas.")
    m = check_updates(deltas, "deltas", finite=check)
    w = as_tensor_arg(weights, "weights")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"weights must be finite and >= 0; got {w.tolist()}.")
    names = list(deltas)
    if w.dim() == 1:
        w = check_weights(w, m)
        cols = {name: w for name in names}
    elif w.dim() == 2:
        if w.shape != (m, len(names)):
            raise ValueError(
                f"Layer-wise weights must be Tensor[m, L] = [{m}, {len(names)}] "
                f"(clients x parameter tensors); got {tuple(w.shape)}."
            )
        cols = {name: w[:, j] for j, name in enumerate(names)}
    else:
        raise ValueError(f"weights must be Tensor[m] or Tensor[m, L]; got shape {tuple(w.shape)}.")
    return {
        name: torch.tensordot(cols[name].to(device=v.device, dtype=v.dtype), v, dims=1) for name, v in deltas.items()
    }

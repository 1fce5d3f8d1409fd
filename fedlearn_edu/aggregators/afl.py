"""Agnostic federated learning (Mohri, Sivek & Suresh, ICML 2019): the minimax's two steps.

AFL solves ``min_x max_{lambda in simplex} sum_k lambda_k L_k(x)`` over the N clients'
losses by stochastic gradient descent on ``x`` and projected gradient *ascent* on ``lambda``
(the paper's Stochastic-AFL, Algorithm 1):

    ``x <- x - gamma_x * grad_x``,            ``grad_x``  estimates ``sum_k lambda_k grad L_k(x)``;
    ``lambda <- Proj(lambda + gamma_l * grad_l)``,  ``grad_l`` estimates ``(L_1(x), ..., L_N(x))``.

With m of the N clients selected uniformly, the unbiased estimates are
``(N/m) sum_{k in S} lambda_k grad L_k`` and ``(N/m) L_k`` on the selected entries (zero
elsewhere); with every client selected (``m = N``) they are exact. ``Proj`` is the Euclidean
projection onto the probability simplex, computed exactly by sorting (Held, Wolfe & Crowder
1974; Duchi et al. 2008).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import Updates, check_losses, check_positive, check_updates
from ._tree import combine

__all__ = ["project_simplex", "afl_lambda_step", "afl_direction"]


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection onto the probability simplex ``{w : w >= 0, sum(w) = 1}``, exact.

    ``w = max(v - theta, 0)`` with the threshold ``theta`` found by sorting: with ``u`` the
    entries of ``v`` in decreasing order and ``r`` the largest ``k`` such that
    ``u_k - (sum_{j <= k} u_j - 1) / k > 0``, ``theta = (sum_{j <= r} u_j - 1) / r``.
    O(n log n).

    Args:
        v: ``Tensor[..., n]``, finite; projected along the last axis.

    Returns:
        ``Tensor[..., n]``, each row on the simplex.

    Example:
        >>> project_simplex(torch.tensor([0.5, 0.5, 0.5]))
        tensor([0.3333, 0.3333, 0.3333])
        >>> project_simplex(torch.tensor([2.0, 0.0]))
        tensor([1., 0.])
    """
    if not isinstance(v, Tensor):
        raise TypeError(f"v must be a torch.Tensor, got {type(v).__name__}.")
    if v.dim() == 0 or v.shape[-1] == 0:
        raise ValueError(f"v must be Tensor[..., n] with n >= 1; got shape {tuple(v.shape)}.")
    if not v.is_floating_point():
        v = v.to(torch.get_default_dtype())
    if not bool(torch.isfinite(v).all()):
        raise ValueError("v contains NaN or Inf.")
    w, r = _project(v)
    if bool((r == 0).any()):
        # Huge entries: u_1 - (u_1 - 1) rounds to 0, so no k passes the test. The projection is
        # invariant to adding a constant to every entry; shifted so that the largest is 0, the
        # test holds at k = 1 exactly (0 - (0 - 1) = 1). Only such rows take this path.
        shifted, _ = _project(v - v.max(dim=-1, keepdim=True).values)
        w = torch.where(r == 0, shifted, w)
    return w


def _project(v: Tensor) -> tuple[Tensor, Tensor]:
    """The sort-based projection of :func:`project_simplex` and each row's support size r (0: failed)."""
    n = v.shape[-1]
    u = torch.sort(v, dim=-1, descending=True).values
    css = torch.cumsum(u, dim=-1) - 1
    k = torch.arange(1, n + 1, device=v.device, dtype=v.dtype)
    support = (u - css / k) > 0  # true for k = 1 (unless rounding, see above) and a prefix of the sorted entries
    r = support.sum(dim=-1, keepdim=True)
    theta = torch.gather(css, -1, (r - 1).clamp_min(0)) / r.clamp_min(1).to(v.dtype)
    return torch.clamp(v - theta, min=0), r


def _selected(clients, m: int, lambdas: Tensor) -> Tensor:
    """Indices of the selected clients into ``lambdas`` (``None``: all, in order)."""
    n = lambdas.shape[0]
    if clients is None:
        if m != n:
            raise ValueError(f"Without `clients`, one entry per client is needed: got {m} for N = {n} lambdas.")
        return torch.arange(n)
    idx = torch.as_tensor(clients)
    if idx.is_floating_point() or idx.dtype == torch.bool or idx.shape != (m,):
        raise ValueError(f"clients must be an integer Tensor[m] with m = {m} (indices into lambdas).")
    idx = idx.long().cpu()
    if bool(((idx < 0) | (idx >= n)).any()):
        raise ValueError(f"clients must index the N = {n} lambdas (0 <= i < N); got {idx.tolist()}.")
    if idx.unique().numel() != m:
        raise ValueError(f"clients must not repeat a client; got {idx.tolist()}.")
    return idx


def _check_lambdas(lambdas) -> Tensor:
    lam = torch.as_tensor(lambdas, dtype=torch.float64).detach().cpu()
    if lam.dim() != 1 or lam.shape[0] == 0:
        raise ValueError(f"lambdas must be Tensor[N] (one mixture weight per client); got shape {tuple(lam.shape)}.")
    if not bool(torch.isfinite(lam).all()) or bool((lam < 0).any()) or abs(float(lam.sum()) - 1) > 1e-6:
        raise ValueError(f"lambdas must lie on the simplex (>= 0, summing to 1); got {lam.tolist()}.")
    return lam


def afl_lambda_step(lambdas, losses, lr: float, clients=None) -> Tensor:
    """AFL's ascent step on the mixture weights: ``lambda+ = Proj(lambda + lr * (N/m) L_S)``.

    Args:
        lambdas: ``Tensor[N]`` current mixture weights (on the simplex).
        losses: ``Tensor[m]`` the selected clients' losses ``L_k(x)`` (the global model's
            loss on their training data).
        lr: the step size ``gamma_lambda`` (> 0).
        clients: integer ``Tensor[m]``, which of the N clients the losses belong to
            (``None``: all N, in order).

    Returns:
        ``Tensor[N]`` (float64) on the simplex.

    Example:
        >>> afl_lambda_step(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 3.0]), lr=0.1)
        tensor([0.4000, 0.6000], dtype=torch.float64)
    """
    lam = _check_lambdas(lambdas)
    x = torch.as_tensor(losses)
    if x.dim() != 1 or x.shape[0] == 0:
        raise ValueError(f"losses must be Tensor[m] (one per selected client); got shape {tuple(x.shape)}.")
    L = check_losses(x, x.shape[0])
    idx = _selected(clients, L.shape[0], lam)
    gamma = check_positive(lr, "lr")
    grad = torch.zeros_like(lam)
    grad[idx] = L * (lam.shape[0] / L.shape[0])
    ascent = lam + gamma * grad
    if not bool(torch.isfinite(ascent).all()):
        raise ValueError(
            f"The ascent step lambda + lr * (N/m) * losses overflows (lr={lr!r}, largest loss {float(L.max()):g}): "
            "use a smaller lr (AFL's lambda_lr)."
        )
    return project_simplex(ascent)


def afl_direction(deltas: Updates, lambdas, clients=None, *, check: bool = True) -> Updates:
    """AFL's descent direction on the model: ``(N/m) sum_{k in S} lambda_k Delta_k``.

    With every client selected this is the lambda-weighted sum ``sum_k lambda_k Delta_k``
    (lambda already sums to one); with m of N selected uniformly it is its unbiased
    estimate. The server sets ``x <- x + eta_s * direction``.

    Args:
        deltas: client updates ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        lambdas: ``Tensor[N]`` mixture weights (on the simplex).
        clients: integer ``Tensor[m]`` indices of the selected clients (``None``: all N).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or a dict of ``Tensor[...]``.

    Example:
        >>> afl_direction(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0.25, 0.75]))
        tensor([0.2500, 0.7500])
    """
    m = check_updates(deltas, "deltas", finite=check)
    lam = _check_lambdas(lambdas)
    idx = _selected(clients, m, lam)
    return combine(lam[idx] * (lam.shape[0] / m), deltas)

"""The conflict-aware baselines of the CRAFT chapter: ConFIG, FedFV and q-FedAvg.

All three take **pseudo-gradients** ``g_i = theta_t - theta_i = -Delta_i`` (pass
``-deltas``) and return a pseudo-gradient step ``s``; the server then sets
``theta_{t+1} = theta_t - eta_s * s``. Inputs are ``Tensor[m, d]`` or a dict of
``Tensor[m, ...]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..checks import (
    Updates,
    as_tensor_arg,
    check_losses,
    check_positive,
    check_range,
    check_rcond,
    check_updates,
)
from ._tree import combine
from .craft import gram_pinv_apply, group_matrices, split_groups, work_dtype

__all__ = ["config_direction", "fedfv_direction", "qfedavg_step"]


def _as_matrices(pseudo_grads: Updates) -> list[Tensor]:
    """The input as a list of ``Tensor[m, d_k]`` blocks (one per dict entry)."""
    if isinstance(pseudo_grads, Tensor):
        return [pseudo_grads]
    m = next(iter(pseudo_grads.values())).shape[0]
    return [v.reshape(m, -1) for v in pseudo_grads.values()]


def _gram(pseudo_grads: Updates) -> Tensor:
    """``Tensor[m, m]`` Gram matrix ``G G^T`` of the (flattened, whole-model) pseudo-gradients, float64."""
    blocks = _as_matrices(pseudo_grads)
    work = work_dtype(blocks[0].device)
    out = None
    for b in blocks:
        bw = b.to(work)
        out = bw @ bw.T if out is None else out + bw @ bw.T
    return out


def _config_one(G: Tensor, rcond: float | None) -> Tensor:
    """ConFIG for one ``Tensor[m, d]`` block."""
    m, d = G.shape
    work = work_dtype(G.device)
    Gw = G.to(work)
    raw = Gw @ Gw.T
    sq = torch.diagonal(raw)
    keep = sq > 0
    k = int(keep.sum())
    if k == 0:
        return torch.zeros(d, dtype=G.dtype, device=G.device)
    if k < m:
        Gw, raw, sq = Gw[keep], raw[keep][:, keep], sq[keep]
    norms = sq.sqrt()
    K = raw / (norms.unsqueeze(1) * norms.unsqueeze(0))
    rtol = check_rcond(rcond, G.dtype, k, d)
    c = gram_pinv_apply(K, torch.ones(k, dtype=work, device=G.device), rtol, d)
    g_u = Gw.T @ (c / norms)  # U^+ 1
    n = torch.linalg.vector_norm(g_u)
    if not bool(n > 0):
        return torch.zeros(d, dtype=G.dtype, device=G.device)
    g_u = g_u / n
    return ((Gw @ g_u).sum() * g_u).to(G.dtype)  # (sum_i g_i . g_u) g_u


def config_direction(
    pseudo_grads: Updates,
    *,
    groups: Mapping[str, Sequence[str]] | None = None,
    rcond: float | None = None,
    check: bool = True,
) -> Updates:
    """ConFIG's conflict-free direction (Liu et al., 2025).

    ``g_u = normalise(U^+ 1_m)`` with ``U`` the row-normalised pseudo-gradients (the
    least-squares solution of ``U g = 1``: equal cosine with every client), then
    ``g = (sum_i g_i . g_u) g_u``. Clients with a zero update are left out. With
    ``U`` of full row rank, ``u_i . g_u > 0`` for every client.

    This is CRAFT with ``g_hat = 0`` and uniform ``rho``, up to the length of ``g``
    (see :func:`fedlearn_edu.aggregators.craft_direction`).

    Args:
        pseudo_grads: ``Tensor[m, d]`` (one problem) or a dict of ``Tensor[m, ...]``,
            solved per key (layer-wise) unless ``groups`` gathers keys into groups;
            ``groups={"all": list(keys)}`` gives the whole-model ConFIG.
        groups: optional ``{group: [key, ...]}``.
        rcond: relative cut-off of the pseudo-inverse (default ``eps * max(m, d)``).
        check: scan ``pseudo_grads`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or a dict shaped like one client's entry.

    Example:
        >>> g = torch.tensor([[1.0, 0.0], [-0.5, 1.0]])
        >>> s = config_direction(g)
        >>> bool(((g @ s) > 0).all())
        True
    """
    m = check_updates(pseudo_grads, "pseudo_grads", finite=check)
    if isinstance(pseudo_grads, Tensor):
        if groups is not None:
            raise ValueError("groups only applies to a dict of per-parameter tensors.")
        return _config_one(pseudo_grads, rcond)
    if groups is None:
        return {k: _config_one(v.reshape(m, -1), rcond).reshape(v.shape[1:]) for k, v in pseudo_grads.items()}
    mats = group_matrices(pseudo_grads, groups)
    return split_groups({q: _config_one(G, rcond) for q, G in mats.items()}, groups, pseudo_grads)


def _check_alpha(alpha) -> float:
    return check_range(alpha, "alpha", 0, 1)


def fedfv_kept(losses, alpha: float) -> Tensor:
    """Which clients FedFV leaves unprojected: the ``alpha`` share with the highest loss.

    The authors' rule ``order[ceil((m - 1)(1 - alpha)):]`` over clients sorted by
    increasing loss: ``ceil(alpha m)`` clients for alpha = 0.1 and every m up to 100 (at
    least one when alpha > 0), none when alpha = 0. Returns a boolean ``Tensor[m]``.

    Args:
        losses: ``Tensor[m]`` the clients' losses, finite.
        alpha: the share of highest-loss clients kept, in [0, 1].

    Raises:
        ValueError: ``losses`` not a finite ``Tensor[m]``, or ``alpha`` outside [0, 1].
    """
    x = as_tensor_arg(losses, "losses")
    if x.dim() != 1:
        raise ValueError(f"losses must be Tensor[m] (one per client); got shape {tuple(x.shape)}.")
    x = check_losses(x, x.shape[0])
    alpha = _check_alpha(alpha)
    m = x.shape[0]
    keep = torch.zeros(m, dtype=torch.bool)
    if alpha > 0:
        order = torch.sort(x, stable=True).indices
        keep[order[math.ceil((m - 1) * (1 - alpha)) :]] = True
    return keep


def fedfv_direction(pseudo_grads: Updates, losses, alpha: float = 0.1, *, check: bool = True) -> Updates:
    """FedFV's aggregate (Wang et al., 2021): project off conflicts, average, rescale.

    Clients are sorted by increasing loss. Every client ``i`` except the
    ``alpha``-share with the highest loss (:func:`fedfv_kept`) is projected, in that
    order over ``j``, off each *original* ``g_j`` it conflicts with:
    ``o_i <- o_i - (o_i . g_j / ||g_j||^2) g_j`` whenever ``o_i . g_j < 0``. The
    result is the uniform mean of the ``o_i``, rescaled to the length of the uniform
    mean of the ``g_i``. (FedFV's optional second step against past rounds' updates,
    tau > 0, is not included.)

    Every ``o_i`` stays a combination ``sum_k C_ik g_k`` of the inputs, so the whole
    procedure runs on the m x m Gram matrix: O(d m^2 + m^3), not O(d m^2) vector passes.
    The inner products are whole-model (a dict input is treated as one flattened vector).

    Args:
        pseudo_grads: ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``, ``g_i = -Delta_i``.
        losses: ``Tensor[m]`` client losses that set the order (FedFV uses the loss of
            the received global model on the client's training data).
        alpha: share of highest-loss clients kept unprojected (0.1 in the paper).
        check: scan ``pseudo_grads`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or a dict shaped like one client's entry.

    Example:
        >>> g = torch.tensor([[1.0, 0.0], [-1.0, 1.0]])
        >>> fedfv_direction(g, torch.tensor([0.1, 0.2]), alpha=0.5)   # client 0 projected off client 1
        tensor([-0.1581,  0.4743])
    """
    m = check_updates(pseudo_grads, "pseudo_grads", finite=check)
    x = check_losses(losses, m)
    alpha = _check_alpha(alpha)
    K = _gram(pseudo_grads)
    work, device = K.dtype, K.device
    kept = fedfv_kept(x, alpha).to(device)
    order = torch.sort(x, stable=True).indices.tolist()
    C = torch.eye(m, dtype=work, device=device)  # o_i = sum_k C[i, k] g_k
    sq = torch.diagonal(K)
    movable = ~kept
    for j in order:
        if not bool(sq[j] > 0):
            continue
        dots = C @ K[:, j]  # o_i . g_j for every i
        hit = (dots < 0) & movable
        hit[j] = False
        C[:, j] -= torch.where(hit, dots / sq[j], torch.zeros_like(dots))
    a = C.mean(0)  # g_t = sum_k a_k g_k
    norm_t = torch.sqrt(torch.clamp(a @ K @ a, min=0))
    mean = torch.full((m,), 1.0 / m, dtype=work, device=device)
    norm_mean = torch.sqrt(torch.clamp(mean @ K @ mean, min=0))
    coef = a * (norm_mean / norm_t) if bool(norm_t > 0) else torch.zeros_like(a)
    return combine(coef, pseudo_grads)


def qfedavg_step(pseudo_grads: Updates, losses, lr: float, q: float = 1.0, *, check: bool = True) -> Updates:
    """q-FedAvg's server step (Li et al., 2020): clients with higher loss weigh more.

    With ``Delta W_k = g_k / lr`` (``g_k = theta_t - theta_k``) and ``F_k`` the loss of
    the global model on client k's training data:

        ``Delta_k = F_k^q Delta W_k``,
        ``h_k = q F_k^(q-1) ||Delta W_k||^2 + F_k^q / lr``,
        ``step = sum_k Delta_k / sum_k h_k``;  the server sets ``theta <- theta - step``.

    ``q = 0`` gives the uniform mean of the ``g_k`` (FedAvg with equal weights). Norms
    are whole-model.

    Args:
        pseudo_grads: ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        losses: ``Tensor[m]`` non-negative ``F_k(theta_t)``.
        lr: the clients' learning rate this round (1/L in the q-FFL paper).
        q: fairness parameter (>= 0).
        check: scan ``pseudo_grads`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or a dict shaped like one client's entry.

    Example:
        >>> g = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> qfedavg_step(g, torch.tensor([1.0, 1.0]), lr=1.0, q=0.0)
        tensor([0.5000, 0.5000])
    """
    m = check_updates(pseudo_grads, "pseudo_grads", finite=check)
    F = check_losses(losses, m)
    if bool((F < 0).any()):
        raise ValueError(f"losses must be >= 0 (q-FedAvg raises them to the power q); got {F.tolist()}.")
    lr = check_positive(lr, "lr")
    q = check_positive(q, "q", allow_zero=True)
    K = _gram(pseudo_grads)
    F = F.to(device=K.device, dtype=K.dtype)
    # In logarithms, shifted by the largest term: F_k^q overflows for a large q (1000) and
    # F_k > 1, and inf / inf would be NaN. The same numbers otherwise.
    log_f = torch.log(F)  # -inf where F_k = 0
    if q == 0:
        log_fq, log_dfq = torch.zeros_like(F), torch.full_like(F, -math.inf)
    else:
        log_fq = q * log_f
        log_dfq = math.log(q) + (torch.zeros_like(F) if q == 1 else (q - 1) * log_f)
        log_dfq = torch.where(log_dfq == math.inf, -math.inf, log_dfq)  # F_k = 0 with q < 1: no term
    sq_dw = torch.diagonal(K) / lr / lr  # ||Delta W_k||^2 (lr**2 could overflow a Python float)
    a = log_dfq + torch.log(sq_dw)  # log(q F^(q-1) ||Delta W||^2)
    b = log_fq - math.log(lr)  # log(F^q / lr)
    terms = torch.cat([a, b])
    finite = terms[torch.isfinite(terms)]
    if finite.numel() == 0:
        return combine(torch.zeros_like(F), pseudo_grads)
    shift = finite.max()
    h = torch.exp(a - shift) + torch.exp(b - shift)
    return combine(torch.exp(b - shift) / h.sum(), pseudo_grads)

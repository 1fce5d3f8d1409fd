"""FedLF's layer-wise fair direction and the exact minimum-norm point of a convex hull it rests on.

Pan et al., "FedLF: Layer-wise fair federated learning", AAAI 2024; the hull's minimum-norm
point is MGDA's QP.

Per layer (or layer group) q, with the clients' pseudo-gradients ``g_{i,q}`` (``g_i = -Delta_i``):

1. every client's layer update is rescaled to the mean length ``mu_q = mean_i ||g_{i,q}||``:
   ``u_{i,q} = mu_q g_{i,q} / ||g_{i,q}||``, so no client dominates a layer by its size;
2. a *fairness* row joins them: ``f_q = sum_i h_i u_{i,q}``, rescaled to length ``mu_q``, with
   ``h = ((L . p) L / ||L|| - p ||L||) / ||L||^2 = -grad_L cos(L, p)``, ``L`` the clients' losses
   and ``p = 1/sqrt(m)`` the uniform preference: a step along ``-d`` with ``f_q . d >= 0``
   does not make the loss vector less uniform;
3. ``d_q`` is the minimum-norm point of the convex hull of those ``m + 1`` rows (MGDA):
   ``d_q . u_{i,q} >= ||d_q||^2 >= 0`` for every row, so no client's layer update conflicts
   with ``d_q``.

The layer directions are concatenated into ``d``, which is then rescaled to the length of
the mean pseudo-gradient ``||mean_i g_i||``; if ``d`` conflicts with some client's whole
update (``g_i . d < 0``, only possible through rounding) the unscaled ``d`` is kept, as in
the authors' code. The server sets ``theta <- theta - eta_s * d``.

Layer groups: with a dict and no ``groups``, one problem per key, i.e. per parameter tensor,
as the authors' code (``gfedplat/algorithm/FedLF/FedLF.py`` in github.com/zibinpan/FedLF,
one index range of ``Module.Loc_list`` per ``model.parameters()`` entry) and the
:class:`~fedlearn_edu.strategies.FedLF` strategy by default; ``groups`` may merge keys
(a module's weight and bias), which changes the direction.

Not included: the authors' extra rows for clients that were online in the last rounds but
not in this one (a strategy can pass their stored pseudo-gradients as additional rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..checks import Updates, check_losses, check_updates
from .craft import group_matrices, split_groups, work_dtype

__all__ = ["min_norm_point", "fedlf_direction"]

_MAX_ITER = 10_000


def _kkt_solve(K: Tensor) -> Tensor:
    k = K.shape[0]
    A = torch.zeros(k + 1, k + 1, dtype=K.dtype, device=K.device)
    A[:k, :k] = K
    A[:k, k] = 1
    A[k, :k] = 1
    rhs = torch.zeros(k + 1, dtype=K.dtype, device=K.device)
    rhs[k] = 1
    return (torch.linalg.pinv(A) @ rhs)[:k]


def _affine_minimiser(K: Tensor) -> Tensor:
    """Weights ``mu`` (summing to 1) of the minimum-norm point of the affine hull, from its Gram matrix.

    The KKT system ``[[K, 1], [1^T, 0]]`` mixes ``K``'s scale with the constraint's ones: when
    ``K``'s entries are large (long updates, e.g. ~1e8 after a large server step) ``pinv`` cuts
    the small singular values that carry the constraint and returns ``mu ~ 0``, which the
    minor cycle would then drop entirely. The minimiser does not depend on ``K``'s scale, so
    such a solve is redone on ``K / max(diag K)``; a well-posed solve is kept as it is.
    """
    mu = _kkt_solve(K)
    total = float(mu.sum())
    if math.isfinite(total) and abs(total - 1) <= 1e-6:
        return mu
    scale = float(torch.diagonal(K).max())
    return _kkt_solve(K / scale) if scale > 0 else mu


def _min_norm_weights(K: Tensor, tol: float) -> Tensor:
    """Wolfe's (1976) minimum-norm-point algorithm on the Gram matrix ``K`` of the points."""
    m = K.shape[0]
    scale = float(torch.diagonal(K).max())
    lam = torch.zeros(m, dtype=K.dtype, device=K.device)
    if scale <= 0:  # every point is the origin
        lam[0] = 1
        return lam
    start = int(torch.argmin(torch.diagonal(K)))
    active = [start]
    lam[start] = 1
    for _ in range(_MAX_ITER):
        Kl = K @ lam
        j = int(torch.argmin(Kl))
        # optimal when no point lies beyond the plane through x orthogonal to x: x.x <= x.p_j
        if float(lam @ Kl - Kl[j]) <= tol * scale or j in active:
            return lam
        before = float(lam @ Kl)
        active.append(j)
        while True:  # minor cycle: move towards the affine minimiser, dropping points that hit zero
            idx = torch.tensor(active, device=K.device)
            mu = _affine_minimiser(K[idx][:, idx])
            if bool((mu > tol).all()):
                lam = torch.zeros_like(lam)
                lam[idx] = mu
                break
            cur = lam[idx]
            neg = mu <= tol
            gap = cur[neg] - mu[neg]
            theta = torch.min(torch.where(gap > 0, cur[neg] / torch.where(gap > 0, gap, 1), 0))
            new = cur + theta * (mu - cur)
            lam = torch.zeros_like(lam)
            lam[idx] = torch.clamp(new, min=0)
            active = [i for i, v in zip(active, new.tolist()) if v > tol]
            if not active:  # cannot happen in exact arithmetic (the new point keeps one weight)
                raise RuntimeError(
                    f"min_norm_point lost every point of its active set (m = {m}, max ||p_i||^2 = {scale:.3g}); "
                    "the Gram matrix is too ill-conditioned for the affine solve."
                )
            lam = lam / lam.sum()
        if float(lam @ K @ lam) >= before:  # no progress: rounding has the last word
            return lam
    raise RuntimeError(f"min_norm_point did not converge in {_MAX_ITER} iterations (m = {m}).")


def min_norm_point(points: Tensor, tol: float = 1e-12) -> Tensor:
    """Weights of the minimum-norm point of the convex hull of the rows of ``points``.

    Solves ``min_lambda ||sum_i lambda_i p_i||^2`` subject to ``lambda >= 0``, ``sum(lambda) = 1``
    exactly (up to rounding) with Wolfe's minimum-norm-point algorithm, a finite active-set
    method, on the m x m Gram matrix in float64. At the solution ``x = lambda^T P``:
    ``p_i . x >= ||x||^2`` for every i, with equality where ``lambda_i > 0``.

    Args:
        points: ``Tensor[m, d]``, finite.
        tol: relative tolerance of the optimality test (times ``max_i ||p_i||^2``).

    Returns:
        ``Tensor[m]`` (float64) of weights on the simplex; the point is ``weights @ points``.

    Example:
        >>> min_norm_point(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        tensor([0.5000, 0.5000], dtype=torch.float64)
        >>> min_norm_point(torch.tensor([[1.0, 1.0], [2.0, 3.0]]))  # the first point is nearest
        tensor([1., 0.], dtype=torch.float64)
    """
    check_updates(points, "points")
    work = work_dtype(points.device)
    P = points.to(work)
    return _min_norm_weights(P @ P.T, tol)


def _fairness_vector(losses: Tensor) -> Tensor | None:
    """``h = ((L . p) L / ||L|| - p ||L||) / ||L||^2`` with ``p = 1/sqrt(m)``; None when it vanishes."""
    m = losses.shape[0]
    norm = torch.linalg.vector_norm(losses)
    if not bool(norm > 0):
        return None
    p = torch.full_like(losses, 1.0 / m**0.5)
    h = ((losses @ p) * losses / norm - p * norm) / norm**2
    return h if bool(torch.linalg.vector_norm(h) > 1e-12 / norm) else None


def _layer_direction(G: Tensor, h: Tensor | None) -> Tensor:
    """Step 1--3 for one layer group ``G: Tensor[m, d_q]`` (work dtype)."""
    norms = torch.linalg.vector_norm(G, dim=1)
    keep = norms > 0
    if not bool(keep.any()):
        return torch.zeros(G.shape[1], dtype=G.dtype, device=G.device)
    mu = norms[keep].mean()
    U = torch.where(keep.unsqueeze(1), G / torch.where(keep, norms, 1).unsqueeze(1) * mu, 0)
    rows = U[keep]
    if h is not None:
        f = h.to(U) @ U
        fn = torch.linalg.vector_norm(f)
        if bool(fn > 0):
            rows = torch.cat([rows, (f / fn * mu).unsqueeze(0)])
    lam = _min_norm_weights(rows @ rows.T, 1e-12)
    return lam @ rows


def fedlf_direction(
    pseudo_grads: Updates, losses=None, *, groups: Mapping[str, Sequence[str]] | None = None, check: bool = True
) -> Updates:
    """FedLF's direction: per layer, the minimum-norm point of the clients' rescaled updates.

    See the module docstring for the three steps and the final rescaling.

    Args:
        pseudo_grads: ``g_i = -Delta_i``, ``Tensor[m, d]`` (one layer) or a dict of
            ``Tensor[m, ...]``, solved per key unless ``groups`` gathers keys into layer groups.
        losses: optional ``Tensor[m]`` of the clients' losses; adds FedLF's fairness row
            (None: the plain layer-wise MGDA direction).
        groups: optional ``{group: [key, ...]}`` (see :func:`fedlearn_edu.params.layer_groups`).
        check: scan ``pseudo_grads`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        The step ``d``, ``Tensor[d]`` or a dict shaped like one client's entry; the server
        sets ``theta <- theta - eta_s * d``.

    Example:
        >>> g = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> fedlf_direction(g)   # min-norm point (0.5, 0.5), rescaled to ||mean g|| = 0.7071
        tensor([0.5000, 0.5000])
    """
    m = check_updates(pseudo_grads, "pseudo_grads", finite=check)
    h = None
    if losses is not None:
        h = _fairness_vector(check_losses(losses, m))
    if isinstance(pseudo_grads, Tensor):
        if groups is not None:
            raise ValueError("groups only applies to a dict of per-parameter tensors.")
        mats = {"all": pseudo_grads}
    else:
        if groups is None:
            groups = {k: [k] for k in pseudo_grads}
        mats = group_matrices(pseudo_grads, groups)
    work = work_dtype(next(iter(mats.values())).device)
    mats = {q: G.to(work) for q, G in mats.items()}
    dirs = {q: _layer_direction(G, h) for q, G in mats.items()}
    # whole-model rescaling to ||mean_i g_i||, unless d conflicts with a client's update
    dot = sum(G @ dirs[q] for q, G in mats.items())  # g_i . d, Tensor[m]
    d_sq = sum(float(v @ v) for v in dirs.values())
    mean_sq = sum(float(G.mean(0) @ G.mean(0)) for G in mats.values())
    g_norms = torch.sqrt(sum((G * G).sum(1) for G in mats.values()))
    conflict = bool((dot < -1e-9 * g_norms * d_sq**0.5).any())
    if d_sq > 0 and not conflict:
        dirs = {q: v * (mean_sq / d_sq) ** 0.5 for q, v in dirs.items()}
    if isinstance(pseudo_grads, Tensor):
        return dirs["all"].to(pseudo_grads.dtype)
    out = split_groups(dirs, groups, pseudo_grads)
    return {k: v.to(pseudo_grads[k].dtype) for k, v in out.items()}

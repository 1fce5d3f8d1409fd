"""CRAFT's minimum-norm correction and the pseudo-inverse it needs, via the m x m Gram matrix.

CRAFT (conflict-resolved aggregation; Wang et al., 2026) solves, per round and
per layer group q,

    minimise 1/2 ||g - g_hat||^2   subject to   U g = rho,

where the rows of ``U`` are the selected clients' *pseudo-gradients*
``g_i = theta_t - theta_i = -Delta_i`` scaled to unit length, ``rho`` holds
positive alignment targets (data shares n_i / sum_j n_j) and ``g_hat`` is a
reference direction (the previous round's aggregate, normalised). The solution
is the minimum-norm correction

    g = g_hat + U^+ (rho - U g_hat).

Everything here works on the m x m Gram matrix K = U U^T: with K's
eigendecomposition, U^+ r = U^T K^+ r, so the cost is O(d m^2) for the Gram
product plus O(m^3) for the eigendecomposition, and memory stays O(m d): no
d x m pseudo-inverse is ever formed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..checks import Updates, as_tensor_arg, check_bool, check_rcond, check_reference, check_updates, check_weights

__all__ = ["craft_direction", "pinv_solve", "gram_pinv_apply", "group_matrices", "split_groups"]


def work_dtype(device: torch.device) -> torch.dtype:
    """float64 for the Gram algebra, except on Apple's MPS which has no float64.

    Args:
        device: where the pseudo-gradients live.

    Returns:
        ``torch.float64``, or ``torch.float32`` on MPS.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def gram_pinv_apply(gram: Tensor, r: Tensor, rtol: float, width: int) -> Tensor:
    """``c = K^+ r`` for a Gram matrix ``K = U U^T``, with pinv's cut-off on the singular values of U.

    A singular value sigma_i of U is kept when ``sigma_i > rtol * sigma_max``, i.e. an
    eigenvalue ``lambda_i = sigma_i^2`` of K when ``lambda_i > rtol^2 * lambda_max`` --
    but never below the precision of K itself: eigenvalues with
    ``lambda_i <= eps * max(m, width) * lambda_max`` (``eps`` of K's dtype, the cut-off
    ``pinv`` would apply to K) are treated as zero. Then ``U^+ r = U^T (K^+ r)``.

    Args:
        gram: ``Tensor[m, m]`` symmetric positive semi-definite.
        r: ``Tensor[m]`` or ``Tensor[m, k]``.
        rtol: relative cut-off on the singular values of U.
        width: d, the number of columns of U (enters the precision floor).

    Returns:
        ``Tensor`` shaped like ``r``.
    """
    m = gram.shape[0]
    evals, evecs = torch.linalg.eigh(gram)
    lam_max = evals[-1]
    if not bool(lam_max > 0):
        return torch.zeros_like(r)
    floor = max(rtol**2, torch.finfo(gram.dtype).eps * max(m, width))
    keep = evals > floor * lam_max
    inv = torch.where(keep, 1.0 / torch.where(keep, evals, torch.ones_like(evals)), torch.zeros_like(evals))
    proj = evecs.T @ r
    proj = proj * (inv if r.dim() == 1 else inv.unsqueeze(1))
    return evecs @ proj


def pinv_solve(matrix: Tensor, r: Tensor, rcond: float | None = None) -> Tensor:
    """``x = A^+ r`` for a wide matrix ``A`` (``Tensor[m, d]``), through its m x m Gram matrix.

    Equals ``torch.linalg.pinv(A) @ r`` (SVD-based, default cut-off ``eps * max(m, d)``
    with ``eps`` of ``A``'s dtype) without forming the d x m pseudo-inverse: the Gram
    matrix ``A A^T`` is factorised in float64 and ``x = A^T (A A^T)^+ r``. Singular
    values below ``sqrt(eps64 * max(m, d)) * sigma_max`` count as zero (the precision
    of the Gram matrix), which only matters for float64 inputs that are nearly, but not
    exactly, rank-deficient.

    Args:
        matrix: ``Tensor[m, d]``.
        r: ``Tensor[m]``.
        rcond: relative cut-off on singular values (default ``eps * max(m, d)``).

    Returns:
        ``Tensor[d]`` in ``matrix``'s dtype.

    Example:
        >>> A = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])   # rank 1
        >>> pinv_solve(A, torch.tensor([1.0, 1.0]))
        tensor([1., 0., 0.])
    """
    if not isinstance(matrix, Tensor) or matrix.dim() != 2:
        raise ValueError(f"matrix must be Tensor[m, d]; got {getattr(matrix, 'shape', type(matrix))}.")
    m, d = matrix.shape
    if not matrix.is_floating_point() or not bool(torch.isfinite(matrix).all()):
        raise ValueError(f"matrix must hold finite floating-point values; got {matrix.dtype} with NaN/Inf or integers.")
    r = as_tensor_arg(r, "r")
    if r.shape != (m,):
        raise ValueError(f"r must be Tensor[m] with m = {m}; got shape {tuple(r.shape)}.")
    work = work_dtype(matrix.device)
    a = matrix.to(work)
    rtol = check_rcond(rcond, matrix.dtype, m, d)
    c = gram_pinv_apply(a @ a.T, r.to(device=matrix.device, dtype=work), rtol, d)
    return (a.T @ c).to(matrix.dtype)


def _gram_of_rows(G: Tensor, what: str) -> tuple[Tensor, Tensor]:
    """``(Gw, Gw @ Gw.T)`` with ``Gw`` = ``G`` in the working dtype, rows rescaled only if needed.

    NaN/Inf anywhere in a row makes that row's diagonal entry non-finite, so the input is
    checked through the Gram matrix (O(m)) instead of a separate pass over all m d values;
    then the exact check names the client. A finite input whose squares overflow (or
    underflow to zero) is rescaled row by row (which changes neither the unit rows u_i
    nor g).
    """
    Gw = G.to(work_dtype(G.device))
    raw = Gw @ Gw.T  # the one O(d m^2) product: Gram of the raw g_i
    diag = torch.diagonal(raw)
    rescale = not bool(torch.isfinite(diag).all())
    if rescale:
        check_updates(G, what)  # raises, naming the client with NaN/Inf
    zero = diag == 0
    if bool(zero.any()) and bool((Gw[zero] != 0).any()):
        rescale = True  # a tiny non-zero row whose squares underflow
    if rescale:
        scale = Gw.abs().amax(dim=1, keepdim=True)
        Gw = Gw / torch.where(scale > 0, scale, torch.ones_like(scale))
        raw = Gw @ Gw.T
    return Gw, raw


def _solve_group(
    G: Tensor,
    rho: Tensor,
    ref: Tensor | None,
    normalize_reference: bool,
    rcond: float | None,
    what: str = "pseudo_grads",
) -> Tensor:
    """CRAFT's correction for one group: ``G`` is ``Tensor[m, d]`` of pseudo-gradients."""
    m, d = G.shape
    work = work_dtype(G.device)
    Gw, raw = _gram_of_rows(G, what)
    sq = torch.diagonal(raw)
    keep = sq > 0  # clients with a zero update here are dropped
    k = int(keep.sum())
    if k == 0:
        return torch.zeros(d, dtype=G.dtype, device=G.device)
    if k == 1:  # one client left: its raw update
        return G[keep][0].clone()
    if k < m:
        Gw, raw, sq, rho = Gw[keep], raw[keep][:, keep], sq[keep], rho[keep]
    r = rho.to(device=G.device, dtype=work)
    total = r.sum()
    r = r / total if bool(total > 0) else torch.full_like(r, 1.0 / k)  # rho renormalised over the rest
    norms = sq.sqrt()
    # Gram of the unit rows u_i = g_i / ||g_i|| without forming U: K = D^-1 (G G^T) D^-1.
    K = raw / (norms.unsqueeze(1) * norms.unsqueeze(0))
    g_hat = None
    if ref is not None:
        g_hat = ref.to(device=G.device, dtype=work).reshape(-1)
        if normalize_reference:
            n = torch.linalg.vector_norm(g_hat)
            g_hat = g_hat / n if bool(n > 0) else None
    residual = r if g_hat is None else r - (Gw @ g_hat) / norms  # rho - U g_hat
    rtol = check_rcond(rcond, G.dtype, k, d)
    c = gram_pinv_apply(K, residual, rtol, d)
    g = Gw.T @ (c / norms)  # U^T c = U^+ (rho - U g_hat)
    if g_hat is not None:
        g = g + g_hat
    return g.to(G.dtype)


def group_matrices(
    tensors: Mapping[str, Tensor], groups: Mapping[str, Sequence[str]], stacked: bool = True, what: str = "pseudo_grads"
) -> dict[str, Tensor]:
    """Concatenate named tensors into one matrix per group: ``{group: Tensor[m, d_q]}``.

    With ``stacked=False`` (one model, e.g. a reference direction) the result is
    ``{group: Tensor[d_q]}``. Every tensor must belong to exactly one group.

    Args:
        tensors: ``{name: Tensor[m, ...]}`` (or ``{name: Tensor[...]}`` with ``stacked=False``).
        groups: ``{group: [names]}``; every key of ``tensors`` in exactly one group.
        stacked: whether the tensors carry a leading client axis.
        what: the argument's name, for the messages.

    Returns:
        ``{group: Tensor[m, d_q]}`` (or ``{group: Tensor[d_q]}``), ``d_q`` the group's size.

    Raises:
        ValueError: an empty group, a name in two groups or in none, or a name not in ``tensors``.
    """
    seen: dict[str, str] = {}
    for group, names in groups.items():
        if len(names) == 0:
            raise ValueError(f"Layer group {group!r} is empty.")
        for name in names:
            if name in seen:
                raise ValueError(f"{what}[{name!r}] is in two layer groups: {seen[name]!r} and {group!r}.")
            if name not in tensors:
                raise ValueError(
                    f"Layer group {group!r} names {name!r}, which is not in {what} (keys: {sorted(tensors)[:6]}...)."
                )
            seen[name] = group
    missing = [k for k in tensors if k not in seen]
    if missing:
        raise ValueError(
            f"{what} entries {missing[:5]} belong to no layer group; list every "
            "parameter in `groups` (see fedlearn_edu.params.layer_groups)."
        )
    out = {}
    for group, names in groups.items():
        if stacked:
            m = tensors[names[0]].shape[0]
            out[group] = torch.cat([tensors[n].reshape(m, -1) for n in names], dim=1)
        else:
            out[group] = torch.cat([tensors[n].reshape(-1) for n in names])
    return out


def split_groups(
    vectors: Mapping[str, Tensor], groups: Mapping[str, Sequence[str]], like: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Inverse of :func:`group_matrices` for one model.

    Args:
        vectors: ``{group: Tensor[d_q]}``, one vector per layer group.
        groups: ``{group: [parameter names]}``, as given to :func:`group_matrices`.
        like: stacked ``{name: Tensor[m, ...]}`` whose shapes (without the client axis) and key
            order the output takes.

    Returns:
        ``{name: Tensor[...]}`` shaped like ``like[name]`` without its leading client axis, in
        ``like``'s key order.
    """
    out = {}
    for group, names in groups.items():
        offset = 0
        for n in names:
            shape = like[n].shape[1:]
            size = shape.numel()
            out[n] = vectors[group][offset : offset + size].reshape(shape)
            offset += size
    return {k: out[k] for k in like}


def craft_direction(
    pseudo_grads: Updates,
    rho,
    reference: Updates | None = None,
    *,
    groups: Mapping[str, Sequence[str]] | None = None,
    normalize_reference: bool = True,
    rcond: float | None = None,
) -> Updates:
    """CRAFT's aggregate: the minimum-norm correction of a reference that agrees with every client.

    Solves ``min 1/2 ||g - g_hat||^2  s.t.  U g = rho`` in closed form,

        ``g = g_hat + U^+ (rho - U g_hat)``,

    with ``U`` the row-normalised pseudo-gradients ``u_i = g_i / ||g_i||``. When ``U``
    has full row rank, ``u_i . g = rho_i > 0`` for every client: no selected client
    conflicts with ``g``. The server then steps ``theta_{t+1} = theta_t - eta_s * g``.

    Sign: the inputs are **pseudo-gradients** ``g_i = theta_t - theta_i = -Delta_i``
    (pass ``-deltas``); the output is a pseudo-gradient too.

    Rules (from the authors' code), applied per group:

    * a client whose update is exactly zero is dropped, and ``rho`` is renormalised
      over the others (to sum to one; uniform if they all have ``rho = 0``);
    * with one client left, ``g`` is that client's raw (unnormalised) ``g_i``;
    * the reference is scaled to unit length (``normalize_reference=True``); a zero
      or missing reference means ``g_hat = 0``.

    ``U^+`` is the Moore--Penrose pseudo-inverse with ``torch.linalg.pinv``'s default
    cut-off, so rank-deficient ``U`` (duplicate or parallel updates) gives the same
    result as the SVD. It is applied through the m x m Gram matrix ``U U^T`` (float64
    eigendecomposition): time O(d m^2 + m^3) per group, memory O(m d).

    Args:
        pseudo_grads: ``Tensor[m, d]`` (one problem: "global" CRAFT), or a dict of
            ``Tensor[m, ...]``. A dict is solved **per key** (each key one layer group),
            unless ``groups`` says how to gather its keys into groups.
        rho: ``Tensor[m]`` non-negative alignment targets, e.g. ``n_i / sum_j n_j``;
            normalised to sum to one.
        reference: the reference ``g_hat``: ``Tensor[d]`` or a dict shaped like one
            client's entry of ``pseudo_grads``; typically the previous round's
            **unscaled** aggregate. ``None``: ``g_hat = 0`` (first round).
        groups: optional ``{group: [key, ...]}`` (e.g. from
            :func:`fedlearn_edu.params.layer_groups`) for a dict input keyed by
            parameter names: each group's tensors are concatenated into one problem.
        normalize_reference: scale the reference of each group to unit length (CRAFT's
            rule). ``False`` uses it as given.
        rcond: relative cut-off on singular values (default ``eps * max(m, d)``, ``eps`` of
            the input dtype).

    Returns:
        ``Tensor[d]``, or a dict with the input's keys and per-model shapes, in the input
        dtype.

    Raises:
        ValueError: NaN/Inf in a client's update (the message names the client), m = 0,
            shape mismatches, or ``rho`` negative / of the wrong length / summing to zero.

    Example:
        >>> g1 = torch.tensor([[1.0, 0.0], [-0.5, 1.0]])        # two pseudo-gradients
        >>> g = craft_direction(g1, torch.tensor([0.5, 0.5]))
        >>> u = g1 / g1.norm(dim=1, keepdim=True)
        >>> torch.allclose(u @ g, torch.tensor([0.5, 0.5]))     # U g = rho: no conflict
        True
    """
    normalize_reference = check_bool(normalize_reference, "normalize_reference")
    m = check_updates(pseudo_grads, "pseudo_grads", finite=False)  # NaN/Inf: checked per group below
    w = check_weights(rho, m, "rho")
    reference = check_reference(reference, pseudo_grads)
    if isinstance(pseudo_grads, Tensor):
        if groups is not None:
            raise ValueError("groups only applies to a dict of per-parameter tensors; got a Tensor[m, d].")
        return _solve_group(pseudo_grads, w, reference, normalize_reference, rcond)
    if groups is None:
        out = {}
        for k, v in pseudo_grads.items():
            ref = None if reference is None else reference[k].reshape(-1)
            out[k] = _solve_group(v.reshape(m, -1), w, ref, normalize_reference, rcond, f"pseudo_grads[{k!r}]").reshape(
                v.shape[1:]
            )
        return out
    mats = group_matrices(pseudo_grads, groups)
    refs = None if reference is None else group_matrices(reference, groups, stacked=False, what="reference")
    sol = {
        q: _solve_group(
            G, w, None if refs is None else refs[q], normalize_reference, rcond, f"pseudo_grads (layer group {q!r})"
        )
        for q, G in mats.items()
    }
    return split_groups(sol, groups, pseudo_grads)

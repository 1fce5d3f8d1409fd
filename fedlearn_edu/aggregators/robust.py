"""Robust aggregation rules: pure functions of stacked client updates.

Inputs are the m selected clients' updates ``Delta`` as ``Tensor[m, d]`` or a dict of
per-layer ``Tensor[m, ...]`` (the stacked-parameter layout); f is the number of clients
assumed faulty. Outputs have the input's structure without the client axis (the
aggregate), except :func:`norm_clip`, which returns clipped stacked updates. Layer-wise
variants are the same functions called on one layer group's sub-dict.

* coordinate-wise median (Yin et al., 2018): per coordinate the median over clients
  (even m: the mean of the two middle values, as ``numpy.median``);
* coordinate-wise trimmed mean (Yin et al., 2018): per coordinate drop the
  ``floor(beta m)`` largest and smallest values, average the rest;
* Krum / Multi-Krum (Blanchard et al., 2017): ``score(i)`` = sum of the squared distances
  from ``Delta_i`` to its ``m - f - 2`` nearest other updates; Krum returns the update with
  the lowest score, Multi-Krum averages the k lowest (ties: the lower index first).
  Needs ``2f + 2 < m``;
* Bulyan (El Mhamdi et al., 2018): ``theta = m - 2f`` updates selected by repeated Krum,
  then per coordinate the mean of the ``beta = theta - 2f`` values closest to their median.
  Needs ``4f + 3 <= m``;
* geometric median by smoothed Weiszfeld (RFA; Pillutla, Kakade & Harchaoui, 2022):
  ``argmin_z sum_i alpha_i ||z - Delta_i||`` by ``z <- sum_i b_i Delta_i / sum_i b_i`` with
  ``b_i = alpha_i / max(nu, ||z - Delta_i||)``;
* centered clipping (Karimireddy, He & Jaggi, 2021): from v, L times
  ``v <- v + (1/m) sum_i clip_tau(Delta_i - v)``, ``clip_tau(x) = x min(1, tau / ||x||)``;
* norm clipping (Sun et al., 2019): ``Delta_i min(1, C / ||Delta_i||)``.

Norms and distances are of the whole update (all entries of the dict together), computed
in float64 (float32 on Apple's MPS).

Differences from Flower's ``flwr.server.strategy.aggregate`` (tested in
``tests/aggregators/test_robust.py``): Flower's Multi-Krum averages the k selected models
weighted by their numbers of examples (here: the plain mean of Blanchard et al., or pass
``weights=``); Flower breaks ties between equal Krum scores by NumPy's unstable argsort
(here: the lower index). Inside Bulyan both use Krum with the same f on the shrinking set,
with ``max(1, r - f - 2)`` neighbours for r remaining updates; with one neighbour two mutual
nearest neighbours tie, and the lower index is taken, so for f <= 2 Bulyan's selection can
depend on the clients' order (every other rule here is permutation invariant).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..checks import Updates, check_int, check_positive, check_range, check_updates, check_weights
from ._tree import map_updates

#: the most iterations :func:`geometric_median` and :func:`centered_clipping` take (a larger
#: count, such as ``2**64``, would not end: refused up front instead of hanging)
MAX_ITERATIONS = 100_000

__all__ = [
    "MAX_ITERATIONS",
    "coordinate_median",
    "trimmed_mean",
    "pairwise_sq_distances",
    "krum_scores",
    "krum_select",
    "krum",
    "bulyan_select",
    "bulyan",
    "geometric_median",
    "centered_clipping",
    "norm_clip",
    "update_norms",
    "max_krum_f",
    "max_bulyan_f",
]


def _work_dtype(t: Tensor) -> torch.dtype:
    return torch.float32 if t.device.type == "mps" else torch.float64


def _leaves(deltas: Updates) -> list[Tensor]:
    return [deltas] if isinstance(deltas, Tensor) else list(deltas.values())


def _median0(t: Tensor) -> Tensor:
    """Median over axis 0; even counts: the mean of the two middle values (as NumPy)."""
    m = t.shape[0]
    s = t.sort(dim=0).values
    if m % 2:
        return s[m // 2]
    return (s[m // 2 - 1] + s[m // 2]) / 2


def coordinate_median(deltas: Updates, *, check: bool = True) -> Updates:
    """Coordinate-wise median of the clients' updates (Yin et al., 2018).

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or ``{name: Tensor[...]}``: per coordinate the median over the m
        clients (even m: the mean of the two middle values, as ``numpy.median``).

    Example:
        >>> coordinate_median(torch.tensor([[0.0, 1.0], [2.0, 5.0], [100.0, 3.0]]))
        tensor([2., 3.])
    """
    check_updates(deltas, "deltas", finite=check)
    return map_updates(_median0, deltas)


def trimmed_mean(deltas: Updates, beta: float, *, check: bool = True) -> Updates:
    """Coordinate-wise trimmed mean (Yin et al., 2018).

    Per coordinate, the ``b = floor(beta m)`` largest and the b smallest values are dropped
    and the remaining ``m - 2b`` averaged (``beta = 0``: the mean). The same rule as
    ``scipy.stats.trim_mean`` and Flower's ``aggregate_trimmed_avg``.

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        beta: the fraction trimmed at each end, in ``[0, 0.5)``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or ``{name: Tensor[...]}``.

    Raises:
        ValueError: ``beta`` outside ``[0, 0.5)``.
    """
    m = check_updates(deltas, "deltas", finite=check)
    beta = check_range(beta, "beta", 0.0, 0.5, high_open=True)
    b = int(beta * m)

    def one(t: Tensor) -> Tensor:
        return t.sort(dim=0).values[b : m - b].mean(dim=0)

    return map_updates(one, deltas)


def pairwise_sq_distances(deltas: Updates, *, check: bool = True) -> Tensor:
    """``Tensor[m, m]`` squared Euclidean distances between the clients' whole updates (float64).

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``D[i, j] = ||Delta_i - Delta_j||^2``, computed from differences (exact zero diagonal).
    """
    m = check_updates(deltas, "deltas", finite=check)
    leaves = _leaves(deltas)
    dtype = _work_dtype(leaves[0])
    out = torch.zeros(m, m, dtype=dtype, device=leaves[0].device)
    for t in leaves:
        x = t.reshape(m, -1).to(dtype)
        for i in range(m):  # m rows of differences: O(m d) memory, no cancellation
            out[i] += ((x - x[i]) ** 2).sum(dim=1)
    return out


def max_krum_f(m: int) -> int:
    """The largest f Krum tolerates among m clients (``2f + 2 < m``), or -1 when none.

    Args:
        m: the number of clients.

    Returns:
        ``floor((m - 3) / 2)``.

    Raises:
        TypeError: ``m`` is not an integer (``2.5`` is not truncated).
        ValueError: ``m < 0``.
    """
    return (check_int(m, "m", 0) - 3) // 2


def max_bulyan_f(m: int) -> int:
    """The largest f Bulyan tolerates among m clients (``4f + 3 <= m``), or -1 when none.

    Args:
        m: the number of clients.

    Returns:
        ``floor((m - 3) / 4)``.

    Raises:
        TypeError: ``m`` is not an integer.
        ValueError: ``m < 0``.
    """
    return (check_int(m, "m", 0) - 3) // 4


def _check_krum_f(f, m: int) -> int:
    f = check_int(f, "f", 0)
    if not 2 * f + 2 < m:
        raise ValueError(
            f"Krum needs 2f + 2 < m (f faulty among m clients); got f={f!r} with m={m}: "
            f"use f <= {max(max_krum_f(m), 0)} or select at least {2 * f + 3} clients."
            if m > 2
            else f"Krum needs 2f + 2 < m; got f={f!r} with m={m} clients: select at least 3 clients"
            + (f" (at least {2 * f + 3} with f={f})." if f else ".")
        )
    return f


def _scores(dist: Tensor, neighbours: int) -> Tensor:
    """Sum of each row's ``neighbours`` smallest off-diagonal entries."""
    m = dist.shape[0]
    if neighbours <= 0 or m < 2:
        return torch.zeros(m, dtype=dist.dtype, device=dist.device)
    off = dist + torch.diag(torch.full((m,), float("inf"), dtype=dist.dtype, device=dist.device))
    return off.sort(dim=1).values[:, :neighbours].sum(dim=1)


def krum_scores(deltas: Updates, f: int, *, check: bool = True) -> Tensor:
    """Krum's scores: per client, the sum of squared distances to its ``m - f - 2`` nearest others.

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        f: the number of faulty clients assumed, ``0 <= f`` and ``2f + 2 < m``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[m]`` (float64).

    Raises:
        ValueError: f out of range.
    """
    m = check_updates(deltas, "deltas", finite=check)
    f = _check_krum_f(f, m)
    return _scores(pairwise_sq_distances(deltas, check=False), m - f - 2)


def krum_select(deltas: Updates, f: int, k: int = 1, *, check: bool = True) -> Tensor:
    """The k clients with the lowest Krum scores (ties: the lower index first).

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        f: the number of faulty clients assumed (``2f + 2 < m``).
        k: how many to select, ``1 <= k <= m``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[k]`` (int64) row indices, by increasing score.

    Raises:
        ValueError: f or k out of range.
    """
    scores = krum_scores(deltas, f, check=check)
    k = check_int(k, "k", 1, scores.shape[0])
    return torch.sort(scores, stable=True).indices[:k]


def krum(deltas: Updates, f: int, k: int = 1, weights=None, *, check: bool = True) -> Updates:
    """Krum (k = 1: the update of the client with the lowest score) or Multi-Krum (the k lowest averaged).

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        f: the number of faulty clients assumed (``2f + 2 < m``).
        k: 1 (Krum) or the number averaged (Multi-Krum), ``<= m``.
        weights: ``Tensor[m]`` optional weights of the mean of the selected (``None``: the
            plain mean of Blanchard et al.; Flower weighs by the numbers of examples).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        Shaped like one client's update; for k = 1 exactly that client's row.
    """
    m = check_updates(deltas, "deltas", finite=check)
    w = None if weights is None else check_weights(weights, m)
    chosen = krum_select(deltas, f, k, check=False)
    if w is not None and float(w[chosen.to(w.device)].sum()) <= 0:
        raise ValueError("weights of the clients Multi-Krum selected sum to zero.")

    def one(t: Tensor) -> Tensor:
        rows = t[chosen.to(t.device)]
        if rows.shape[0] == 1:
            return rows[0].clone()
        if w is None:
            return rows.mean(dim=0)
        p = w[chosen.to(w.device)].to(torch.float64)
        p = (p / p.sum()).to(device=t.device, dtype=t.dtype)
        return torch.tensordot(p, rows, dims=1)

    return map_updates(one, deltas)


def _check_bulyan_f(f, m: int) -> int:
    f = check_int(f, "f", 0)
    if not 4 * f + 3 <= m:
        raise ValueError(
            f"Bulyan needs 4f + 3 <= m (f faulty among m clients); got f={f!r} with m={m}: "
            + (
                f"use f <= {max_bulyan_f(m)} or select at least {4 * f + 3} clients."
                if m >= 3
                else "select at least 3 clients" + (f" (at least {4 * f + 3} with f={f})." if f else ".")
            )
        )
    return f


def bulyan_select(deltas: Updates, f: int, *, check: bool = True) -> Tensor:
    """Bulyan's first stage: ``theta = m - 2f`` clients chosen by repeated Krum.

    Each step runs Krum (the same f, ``max(1, r - f - 2)`` neighbours among the r updates
    still in the pool, as Flower) and moves its choice out of the pool.

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        f: the number of faulty clients assumed (``4f + 3 <= m``).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[theta]`` (int64) row indices in the order chosen.

    Raises:
        ValueError: f out of range.
    """
    m = check_updates(deltas, "deltas", finite=check)
    f = _check_bulyan_f(f, m)
    dist = pairwise_sq_distances(deltas, check=False)
    pool = list(range(m))
    chosen = []
    for _ in range(m - 2 * f):
        r = len(pool)
        sub = dist[pool][:, pool]
        scores = _scores(sub, min(max(1, r - f - 2), r - 1))
        best = int(torch.argmin(scores))  # first minimum: the lower index
        chosen.append(pool.pop(best))
    return torch.tensor(chosen, dtype=torch.long)


def bulyan(deltas: Updates, f: int, *, check: bool = True) -> Updates:
    """Bulyan (El Mhamdi, Guerraoui & Rouault, 2018).

    ``theta = m - 2f`` updates selected by repeated Krum (:func:`bulyan_select`), then per
    coordinate the mean of the ``beta = theta - 2f`` selected values closest to their
    coordinate-wise median.

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        f: the number of faulty clients assumed, ``4f + 3 <= m``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        Shaped like one client's update.

    Raises:
        ValueError: f out of range.
    """
    m = check_updates(deltas, "deltas", finite=check)
    f = _check_bulyan_f(f, m)
    chosen = bulyan_select(deltas, f, check=False)
    beta = m - 4 * f

    def one(t: Tensor) -> Tensor:
        s = t[chosen.to(t.device)]
        med = _median0(s)
        order = torch.sort((s - med).abs(), dim=0, stable=True).indices[:beta]
        return torch.gather(s, 0, order).mean(dim=0)

    return map_updates(one, deltas)


def update_norms(deltas: Updates, *, check: bool = True) -> Tensor:
    """``Tensor[m]``: the Euclidean norm of each client's whole update (float64).

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``||Delta_i||`` over all entries of the dict together.
    """
    m = check_updates(deltas, "deltas", finite=check)
    leaves = _leaves(deltas)
    dtype = _work_dtype(leaves[0])
    sq = sum((t.reshape(m, -1).to(dtype) ** 2).sum(dim=1) for t in leaves)
    return sq.sqrt()


def _scale_rows(deltas: Updates, factor: Tensor) -> Updates:
    def one(t: Tensor) -> Tensor:
        f = factor.to(device=t.device, dtype=torch.promote_types(t.dtype, factor.dtype))
        return (t.to(f.dtype) * f.reshape(-1, *([1] * (t.dim() - 1)))).to(t.dtype)

    return map_updates(one, deltas)


def _clip_factors(norms: Tensor, clip: float) -> Tensor:
    """``min(1, clip / norm)``; 1 for a zero norm."""
    ones = torch.ones_like(norms)
    return torch.where(norms > clip, clip / torch.where(norms > 0, norms, ones), ones)


def norm_clip(deltas: Updates, clip: float, *, check: bool = True) -> tuple[Updates, Tensor]:
    """Each client's update scaled down to norm at most C: ``Delta_i min(1, C / ||Delta_i||)``.

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        clip: C > 0.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``(clipped, factors)``: the clipped updates (the input's structure, with the client
        axis) and ``Tensor[m]`` the factors ``min(1, C / ||Delta_i||)`` (float64).

    Raises:
        ValueError: ``clip <= 0``.
    """
    clip = check_positive(clip, "clip")
    factors = _clip_factors(update_norms(deltas, check=check), clip)
    return _scale_rows(deltas, factors), factors


def geometric_median(
    deltas: Updates,
    weights=None,
    nu: float = 1e-6,
    iterations: int = 100,
    ftol: float = 1e-10,
    *,
    check: bool = True,
) -> tuple[Updates, int]:
    """Geometric median by smoothed Weiszfeld iterations (RFA, Pillutla et al., 2022).

    Minimises ``sum_i alpha_i ||z - Delta_i||`` (``alpha = weights / sum(weights)``) from the
    weighted mean: ``z <- sum_i b_i Delta_i / sum_i b_i``, ``b_i = alpha_i / max(nu, ||z - Delta_i||)``,
    until the objective's relative decrease is below ``ftol`` or ``iterations`` steps are done
    (RFA's stopping rule).

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        weights: ``Tensor[m]`` non-negative weights alpha (``None``: uniform).
        nu: the smoothing nu > 0 (a distance floor: keeps the weights finite when z meets a point).
        iterations: the most Weiszfeld steps, in ``[1, MAX_ITERATIONS]``.
        ftol: relative tolerance on the objective, >= 0.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``(z, steps)``: z shaped like one client's update, and the number of steps taken.

    Raises:
        ValueError: a bad ``nu``, ``iterations`` or ``ftol``.
    """
    m = check_updates(deltas, "deltas", finite=check)
    alpha = torch.ones(m) if weights is None else check_weights(weights, m)
    nu = check_positive(nu, "nu")
    iterations = check_int(iterations, "iterations", 1, MAX_ITERATIONS)
    ftol = check_positive(ftol, "ftol", allow_zero=True)
    leaves = _leaves(deltas)
    dtype = _work_dtype(leaves[0])
    dev = leaves[0].device
    xs = [t.reshape(m, -1).to(dtype) for t in leaves]
    alpha = alpha.to(device=dev, dtype=dtype)
    alpha = alpha / alpha.sum()

    def mean(b: Tensor) -> list[Tensor]:
        p = b / b.sum()
        return [p @ x for x in xs]

    def dist(z: list[Tensor]) -> Tensor:
        return sum(((x - zk) ** 2).sum(dim=1) for x, zk in zip(xs, z)).sqrt()

    z = mean(alpha)
    obj = float((alpha * dist(z)).sum())
    steps = 0
    for _ in range(iterations):
        b = alpha / dist(z).clamp_min(nu)
        z = mean(b)
        steps += 1
        new = float((alpha * dist(z)).sum())
        done = abs(obj - new) <= ftol * new
        obj = new
        if done:
            break
    out = [zk.reshape(t.shape[1:]).to(t.dtype) for zk, t in zip(z, leaves)]
    if isinstance(deltas, Tensor):
        return out[0], steps
    return dict(zip(deltas.keys(), out)), steps


def centered_clipping(
    deltas: Updates, tau: float, iterations: int = 1, v: Updates | None = None, *, check: bool = True
) -> Updates:
    """Centered clipping (Karimireddy, He & Jaggi, 2021).

    From the centre v (the last aggregate, or 0), ``iterations`` (L) times
    ``v <- v + (1/m) sum_i clip_tau(Delta_i - v)`` with ``clip_tau(x) = x min(1, tau / ||x||)``.

    Args:
        deltas: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        tau: the clipping radius > 0.
        iterations: L, in ``[1, MAX_ITERATIONS]``.
        v: the starting centre, shaped like one client's update (``None``: zero).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        The new centre v, shaped like one client's update.

    Raises:
        ValueError: a bad ``tau`` or ``iterations``, or ``v`` not shaped like an update.
    """
    m = check_updates(deltas, "deltas", finite=check)
    tau = check_positive(tau, "tau")
    iterations = check_int(iterations, "iterations", 1, MAX_ITERATIONS)
    leaves = _leaves(deltas)
    dtype = _work_dtype(leaves[0])
    xs = [t.reshape(m, -1).to(dtype) for t in leaves]
    if v is None:
        vs = [torch.zeros_like(x[0]) for x in xs]
    else:
        if not isinstance(deltas, Tensor) and (not isinstance(v, Mapping) or not set(deltas) <= set(v)):
            raise ValueError(f"v must be a dict with the keys of deltas ({sorted(deltas)[:6]}), or None.")
        v_leaves = [v] if isinstance(deltas, Tensor) else [v[k] for k in deltas]
        for vk, t in zip(v_leaves, leaves):
            if not isinstance(vk, Tensor) or tuple(vk.shape) != tuple(t.shape[1:]):
                raise ValueError(f"v must be shaped like one client's update ({tuple(t.shape[1:])}).")
            if vk.is_floating_point() and not bool(torch.isfinite(vk).all()):
                raise ValueError("v, the starting centre, holds NaN or Inf: the aggregate would be NaN.")
        vs = [vk.reshape(-1).to(device=x.device, dtype=dtype) for vk, x in zip(v_leaves, xs)]
    for _ in range(iterations):
        diffs = [x - vk for x, vk in zip(xs, vs)]
        norms = sum((d**2).sum(dim=1) for d in diffs).sqrt()
        c = _clip_factors(norms, tau)
        vs = [vk + (c @ d) / m for vk, d in zip(vs, diffs)]
    out = [vk.reshape(t.shape[1:]).to(t.dtype) for vk, t in zip(vs, leaves)]
    if isinstance(deltas, Tensor):
        return out[0]
    return dict(zip(deltas.keys(), out))

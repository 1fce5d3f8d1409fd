"""Convergence theory under heterogeneity: dissimilarity, drift, the rates' terms, partial participation.

The quantities the chapter *Why FedAvg drifts, in theorems* states its assumptions and
theorems with, each a pure function of tensors (float64 recommended):

* the **gradient dissimilarity** of a federation at a point,
  ``zeta^2(x) = sum_i p_i ||grad f_i(x) - grad f(x)||^2`` (:func:`gradient_dissimilarity`), in closed
  form for the package's quadratics (:func:`quadratic_dissimilarity`), and the **(G, B) form**
  ``sum_i p_i ||grad f_i(x)||^2 <= G^2 + B^2 ||grad f(x)||^2`` of Karimireddy et al. (2020), whose
  smallest ``G^2`` for a given ``B^2`` the quadratics also give in closed form (:func:`quadratic_gb`);
* the **drift lemma**'s bound on how far the clients' local iterates wander from the server model
  (:func:`drift_bound`), and the first-order prediction of FedAvg's error floor on the quadratics
  (:func:`fedavg_floor_prediction`);
* the terms of **Theorem I** (FedAvg) and **Theorem III** (SCAFFOLD) of Karimireddy et al. (2020),
  strongly convex case, as numbers of rounds to reach an error ``eps`` up to constants and
  logarithmic factors (:func:`fedavg_rounds_terms`, :func:`scaffold_rounds_terms`);
* the two **partial-participation estimators** of the full average ``sum_i p_i Delta_i`` from ``m``
  clients sampled uniformly without replacement, the unbiased ``(N/m) sum_{i in S} p_i Delta_i`` and
  the one renormalised over the sampled clients ``sum_{i in S} p_i Delta_i / sum_{i in S} p_i``
  (:func:`unbiased_estimate`, :func:`renormalised_estimate`), their derived mean squared errors
  (:func:`estimator_mse`) and their exact moments by enumerating every sample (:func:`estimator_moments`).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from .checks import check_int, check_positive

__all__ = [
    "gradient_dissimilarity",
    "quadratic_gradients",
    "quadratic_dissimilarity",
    "quadratic_gb",
    "drift_bound",
    "fedavg_floor_prediction",
    "fedavg_rounds_terms",
    "scaffold_rounds_terms",
    "unbiased_estimate",
    "renormalised_estimate",
    "estimator_mse",
    "estimator_moments",
]


def _matrix(x, name: str) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"{name} must be a Tensor[N, d] (one row per client); got {getattr(x, 'shape', type(x))}.")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite.")
    return x


def _weights(weights, n: int, dtype: torch.dtype) -> Tensor:
    if weights is None:
        return torch.full((n,), 1.0 / n, dtype=dtype)
    w = torch.as_tensor(weights, dtype=dtype)
    if w.shape != (n,) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or not float(w.sum()) > 0:
        raise ValueError(f"weights must be Tensor[N] (N = {n}), finite, >= 0, with a positive sum; got {weights!r}.")
    return w / w.sum()


def gradient_dissimilarity(grads: Tensor, weights=None) -> Tensor:
    """``zeta^2 = sum_i p_i ||g_i - g||^2`` with ``g = sum_i p_i g_i``: how far the clients' gradients spread.

    Args:
        grads: the clients' gradients at one point, ``Tensor[N, d]``.
        weights: ``Tensor[N]`` data weights (e.g. sample counts ``n_i``), normalised to ``p``; equal if None.

    Returns:
        A 0-d tensor. It equals ``sum_i p_i ||g_i||^2 - ||g||^2``.

    Example:
        >>> g = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
        >>> gradient_dissimilarity(g)  # the mean is 0, each is at distance 1
        tensor(1., dtype=torch.float64)
    """
    g = _matrix(grads, "grads")
    p = _weights(weights, g.shape[0], g.dtype)
    mean = p @ g
    return p @ ((g - mean) ** 2).sum(1)


def quadratic_gradients(A: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """The clients' gradients ``A_i (x - b_i)`` of the quadratics ``f_i = 1/2 (x - b_i)^T A_i (x - b_i)``.

    Args:
        A: ``Tensor[N, d, d]`` (see :func:`fedlearn_edu.quadratics.make_quadratics`).
        b: ``Tensor[N, d]``.
        x: ``Tensor[d]``.

    Returns:
        ``Tensor[N, d]``.
    """
    if A.dim() != 3 or b.shape != A.shape[:2] or x.shape != A.shape[1:2]:
        raise ValueError(
            f"A must be Tensor[N, d, d], b Tensor[N, d], x Tensor[d]; got {tuple(A.shape)}, {tuple(b.shape)}, "
            f"{tuple(x.shape)}."
        )
    return torch.einsum("ijk,ik->ij", A, x.expand_as(b) - b)


def _moments(A: Tensor, b: Tensor, weights):
    """``H, S, v, zeta*^2``: the quadratic form of ``sum_i p_i ||grad f_i(x*+e)||^2`` in ``e``."""
    from .quadratics import global_optimum

    p = _weights(weights, A.shape[0], A.dtype)
    x_star = global_optimum(A, b, p)
    g_star = quadratic_gradients(A, b, x_star)  # grad f_i(x*), Tensor[N, d], p-mean zero
    H = torch.einsum("i,ijk->jk", p, A)
    S = torch.einsum("i,ijk,ikl->jl", p, A, A)  # sum_i p_i A_i^2
    v = torch.einsum("i,ijk,ik->j", p, A, g_star)  # sum_i p_i A_i grad f_i(x*)
    return H, S, v, p @ (g_star**2).sum(1), x_star


def quadratic_dissimilarity(A: Tensor, b: Tensor, x: Tensor | None = None, weights=None) -> Tensor:
    """``zeta^2(x)`` of the quadratics in closed form: ``e^T (S - H^2) e + 2 e^T v + zeta*^2``, ``e = x - x*``.

    With ``H = sum_i p_i A_i``, ``S = sum_i p_i A_i^2``, ``v = sum_i p_i A_i grad f_i(x*)`` and
    ``zeta*^2 = sum_i p_i ||grad f_i(x*)||^2``: expand ``grad f_i(x) = A_i e + grad f_i(x*)`` and use
    ``sum_i p_i grad f_i(x*) = 0``. Unless every ``A_i`` is the same, ``S - H^2`` is not zero and
    ``zeta^2(x)`` grows without bound in ``x``: a uniform bound on ``zeta^2`` fails on quadratics, the
    (G, B) form (:func:`quadratic_gb`) holds.

    Args:
        A: ``Tensor[N, d, d]``.
        b: ``Tensor[N, d]``.
        x: ``Tensor[d]``, the point (default: the optimum ``x*``, where ``zeta^2 = zeta*^2``).
        weights: ``Tensor[N]`` data weights (default: equal).

    Returns:
        A 0-d tensor.

    Example:
        >>> from fedlearn_edu.quadratics import make_quadratics
        >>> A, b = make_quadratics(4, 3, seed=0)
        >>> x = torch.ones(3, dtype=torch.float64)
        >>> bool(torch.isclose(quadratic_dissimilarity(A, b, x), gradient_dissimilarity(quadratic_gradients(A, b, x))))
        True
    """
    H, S, v, zeta2_star, x_star = _moments(A, b, weights)
    if x is None:
        return zeta2_star
    e = torch.as_tensor(x, dtype=A.dtype) - x_star
    return e @ (S - H @ H) @ e + 2 * e @ v + zeta2_star


def quadratic_gb(A: Tensor, b: Tensor, B2: float | None = None, weights=None) -> tuple[float, float]:
    """The smallest ``G^2`` with ``sum_i p_i ||grad f_i(x)||^2 <= G^2 + B^2 ||grad f(x)||^2`` for all ``x``.

    The left side minus ``B^2 ||grad f||^2`` is ``e^T (S - B^2 H^2) e + 2 e^T v + zeta*^2`` (see
    :func:`quadratic_dissimilarity`); it is bounded iff ``M = B^2 H^2 - S`` is positive definite,
    and then its maximum is ``G^2 = zeta*^2 + v^T M^{-1} v``, reached at ``e = M^{-1} v``.

    Args:
        A: ``Tensor[N, d, d]``.
        b: ``Tensor[N, d]``.
        B2: ``B^2``; must exceed ``B2_min = lambda_max(H^{-1} S H^{-1})`` (>= 1). Default ``2 * B2_min``.
        weights: ``Tensor[N]`` data weights (default: equal).

    Returns:
        ``(G2, B2)`` as floats.

    Example:
        >>> from fedlearn_edu.quadratics import make_quadratics
        >>> A, b = make_quadratics(5, 2, seed=0)
        >>> G2, B2 = quadratic_gb(A, b)
        >>> G2 >= float(quadratic_dissimilarity(A, b)) and B2 >= 1
        True
    """
    H, S, v, zeta2_star, _ = _moments(A, b, weights)
    Hinv = torch.linalg.inv(H)
    b2_min = float(torch.linalg.eigvalsh(Hinv @ S @ Hinv).max())
    B2 = 2 * b2_min if B2 is None else float(B2)
    if not B2 > b2_min * (1 + 1e-12):
        raise ValueError(f"B2 must exceed lambda_max(H^-1 S H^-1) = {b2_min:.6g} for a finite G^2; got {B2}.")
    M = B2 * H @ H - S
    return float(zeta2_star + v @ torch.linalg.solve(M, v)), B2


def drift_bound(lr: float, local_steps: int, smoothness: float, grad_sq_mean, noise_var: float = 0.0):
    """The drift lemma: ``sum_i p_i E||y_{i,k} - x||^2 <= 5 K lr^2 (2 (K + 1) Gamma + sigma^2)`` for ``k <= K``.

    ``y_{i,k}`` is client i's iterate after ``k`` local (stochastic) gradient steps of size ``lr`` from
    the server model ``x``, ``Gamma = sum_i p_i ||grad f_i(x)||^2 = zeta^2(x) + ||grad f(x)||^2`` and
    ``sigma^2`` the variance of a stochastic gradient. It holds for L-smooth ``f_i`` when
    ``lr <= 1 / (2 L (K + 1))`` (the chapter proves it).

    Args:
        lr: the local step size ``eta > 0``.
        local_steps: ``K >= 1``.
        smoothness: ``L > 0``.
        grad_sq_mean: ``Gamma`` (a float or a tensor of them).
        noise_var: ``sigma^2 >= 0``.

    Returns:
        The bound, of the type of ``grad_sq_mean``.

    Raises:
        ValueError: when ``lr > 1 / (2 L (K + 1))``, where the lemma does not hold.

    Example:
        >>> round(drift_bound(0.01, 4, 1.0, 2.0), 10)  # 5 * 4 * 1e-4 * (2 * 5 * 2)
        0.04
    """
    lr, L = check_positive(lr, "lr"), check_positive(smoothness, "smoothness")
    K = check_int(local_steps, "local_steps", 1)
    noise_var = check_positive(noise_var, "noise_var", allow_zero=True)
    if lr > 1 / (2 * L * (K + 1)) * (1 + 1e-12):
        raise ValueError(f"the drift lemma needs lr <= 1 / (2 L (K + 1)) = {1 / (2 * L * (K + 1)):.4g}; got lr = {lr}.")
    return 5 * K * lr**2 * (2 * (K + 1) * grad_sq_mean + noise_var)


def fedavg_floor_prediction(A: Tensor, b: Tensor, local_steps: int, lr: float, weights=None) -> Tensor:
    """First-order (small ``lr``) prediction of FedAvg's fixed-point error: ``lr (K - 1) / 2 H^{-1} v``.

    Expanding ``M_i = I - (I - lr A_i)^K = lr K A_i - lr^2 K (K - 1) / 2 A_i^2 + O(lr^3 K^3)`` in
    the fixed-point equation ``sum_i p_i M_i (b_i - x) = 0`` gives
    ``x_FedAvg - x* = lr (K - 1) / 2 H^{-1} v + O(lr^2 K^2)``, ``v = sum_i p_i A_i grad f_i(x*)``: the
    squared error floor grows as ``lr^2 (K - 1)^2`` and, scaling the spread of the ``b_i``, as ``zeta*^2``.

    Args:
        A: ``Tensor[N, d, d]``.
        b: ``Tensor[N, d]``.
        local_steps: ``K >= 1``, the same for every client.
        lr: the local step size.
        weights: ``Tensor[N]`` data weights (default: equal).

    Returns:
        ``Tensor[d]``, the predicted ``x_FedAvg - x*``.
    """
    K = check_int(local_steps, "local_steps", 1)
    lr = check_positive(lr, "lr")
    H, _, v, _, _ = _moments(A, b, weights)
    return lr * (K - 1) / 2 * torch.linalg.solve(H, v)


def fedavg_rounds_terms(
    *,
    mu: float,
    smoothness: float,
    sigma2: float,
    G2: float,
    B2: float,
    local_steps: int,
    sampled: int,
    num_clients: int,
    eps: float,
) -> dict[str, float]:
    """Karimireddy et al. (2020), Theorem I, strongly convex: the terms of the rounds FedAvg needs for error ``eps``.

    ``R = O~( sigma^2/(mu K S eps) + (1 - S/N) G^2/(mu S eps) + sqrt(L) G/(mu sqrt(eps)) + B^2 L/mu )``
    (constants and log factors left out, as in the theorem): ``"noise"``, ``"sampling"``, ``"drift"``,
    ``"conditioning"``. Only ``"drift"`` and ``"sampling"`` involve the dissimilarity ``G``; SCAFFOLD's
    theorem has neither (:func:`scaffold_rounds_terms`).

    Args:
        mu: strong convexity ``mu > 0``.
        smoothness: ``L >= mu``.
        sigma2: stochastic-gradient variance ``sigma^2 >= 0``.
        G2: ``G^2 >= 0`` of the (G, B) form.
        B2: ``B^2 >= 1`` of the (G, B) form.
        local_steps: ``K >= 1``.
        sampled: clients per round ``S``, ``1 <= S <= N``.
        num_clients: ``N``.
        eps: the target error ``eps > 0``.

    Returns:
        ``{"noise", "sampling", "drift", "conditioning"}`` -> float.
    """
    mu, L, eps = check_positive(mu, "mu"), check_positive(smoothness, "smoothness"), check_positive(eps, "eps")
    sigma2 = check_positive(sigma2, "sigma2", allow_zero=True)
    G2, B2 = check_positive(G2, "G2", allow_zero=True), check_positive(B2, "B2")
    K = check_int(local_steps, "local_steps", 1)
    N = check_int(num_clients, "num_clients", 1)
    S = check_int(sampled, "sampled", 1, N)
    return {
        "noise": sigma2 / (mu * K * S * eps),
        "sampling": (1 - S / N) * G2 / (mu * S * eps),
        "drift": math.sqrt(L * G2) / (mu * math.sqrt(eps)),
        "conditioning": B2 * L / mu,
    }


def scaffold_rounds_terms(
    *, mu: float, smoothness: float, sigma2: float, local_steps: int, sampled: int, num_clients: int, eps: float
) -> dict[str, float]:
    """Karimireddy et al. (2020), Theorem III, strongly convex: ``R = O~(sigma^2/(mu K S eps) + L/mu + N/S)``.

    No term depends on the dissimilarity: the control variates remove it.

    Args:
        mu: strong convexity ``mu > 0``.
        smoothness: ``L >= mu``.
        sigma2: stochastic-gradient variance ``sigma^2 >= 0``.
        local_steps: ``K >= 1``.
        sampled: clients per round ``S``, ``1 <= S <= N``.
        num_clients: ``N``.
        eps: the target error ``eps > 0``.

    Returns:
        ``{"noise", "conditioning", "sampling"}`` -> float.
    """
    mu, L, eps = check_positive(mu, "mu"), check_positive(smoothness, "smoothness"), check_positive(eps, "eps")
    sigma2 = check_positive(sigma2, "sigma2", allow_zero=True)
    K = check_int(local_steps, "local_steps", 1)
    N = check_int(num_clients, "num_clients", 1)
    S = check_int(sampled, "sampled", 1, N)
    return {"noise": sigma2 / (mu * K * S * eps), "conditioning": L / mu, "sampling": N / S}


def _sampled(deltas: Tensor, weights) -> tuple[Tensor, Tensor]:
    d = _matrix(deltas, "deltas")
    w = torch.as_tensor(weights, dtype=d.dtype)
    if w.shape != (d.shape[0],) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"weights must be Tensor[m] (m = {d.shape[0]}), finite and >= 0.")
    return d, w


def unbiased_estimate(deltas: Tensor, weights: Tensor, num_clients: int) -> Tensor:
    """``(N/m) sum_{i in S} p_i Delta_i``: unbiased for ``sum_i p_i Delta_i`` under uniform sampling of ``m`` of ``N``.

    Args:
        deltas: the sampled clients' updates, ``Tensor[m, d]``.
        weights: their data shares ``p_i = n_i / n`` over the whole federation, ``Tensor[m]``.
        num_clients: ``N``, the federation's size.

    Returns:
        ``Tensor[d]``.

    Example:
        >>> unbiased_estimate(torch.ones(2, 1), torch.tensor([0.1, 0.2]), 4)  # (4/2) * 0.3
        tensor([0.6000])
    """
    d, p = _sampled(deltas, weights)
    N = check_int(num_clients, "num_clients", d.shape[0])
    return N / d.shape[0] * (p @ d)


def renormalised_estimate(deltas: Tensor, weights: Tensor) -> Tensor:
    """``sum_{i in S} p_i Delta_i / sum_{i in S} p_i``: the weighted mean over the sampled clients (biased).

    Args:
        deltas: the sampled clients' updates, ``Tensor[m, d]``.
        weights: their weights (any positive scale: only ratios matter), ``Tensor[m]``.

    Returns:
        ``Tensor[d]``.

    Example:
        >>> renormalised_estimate(torch.ones(2, 1), torch.tensor([0.1, 0.2]))
        tensor([1.])
    """
    d, p = _sampled(deltas, weights)
    if not float(p.sum()) > 0:
        raise ValueError("the sampled clients' weights sum to 0: the renormalised estimate is undefined.")
    return (p @ d) / p.sum()


def estimator_mse(deltas: Tensor, weights, sampled: int, estimator: str = "unbiased") -> Tensor:
    """Derived ``E||estimate - sum_i p_i Delta_i||^2`` under uniform sampling of ``m`` of ``N`` without replacement.

    ``"unbiased"`` (exact): with ``z_i = p_i Delta_i`` and ``z_bar = (1/N) sum_i z_i``,
    ``N^2 (1 - m/N) / m * 1/(N-1) sum_i ||z_i - z_bar||^2`` (the variance of a sample mean).
    ``"renormalised"`` (delta method, first order in ``1/m``; exact for equal ``p``): the same with
    ``z_i`` replaced by ``p_i (Delta_i - Delta_bar)``, ``Delta_bar = sum_i p_i Delta_i``.

    Args:
        deltas: every client's update, ``Tensor[N, d]``.
        weights: ``Tensor[N]`` data weights (normalised to ``p``).
        sampled: ``m``, ``1 <= m <= N``.
        estimator: ``"unbiased"`` or ``"renormalised"``.

    Returns:
        A 0-d tensor (0 when ``m = N``).
    """
    d = _matrix(deltas, "deltas")
    N = d.shape[0]
    m = check_int(sampled, "sampled", 1, N)
    p = _weights(weights, N, d.dtype)
    if estimator == "unbiased":
        z = p[:, None] * d
    elif estimator == "renormalised":
        z = p[:, None] * (d - p @ d)
    else:
        raise ValueError(f"estimator must be 'unbiased' or 'renormalised'; got {estimator!r}.")
    if N == 1:
        return torch.zeros((), dtype=d.dtype)
    spread = ((z - z.mean(0)) ** 2).sum() / (N - 1)
    return N**2 * (1 - m / N) / m * spread


def estimator_moments(deltas: Tensor, weights, sampled: int, estimator: str = "unbiased") -> tuple[Tensor, Tensor]:
    """Exact mean and mean squared error of an estimator over every one of the ``C(N, m)`` equally likely samples.

    For small federations (``C(N, m) <= 200000``): the reference the derived formulas are tested against.

    Args:
        deltas: every client's update, ``Tensor[N, d]``.
        weights: ``Tensor[N]`` data weights (normalised to ``p``).
        sampled: ``m``, ``1 <= m <= N``.
        estimator: ``"unbiased"`` or ``"renormalised"``.

    Returns:
        ``(mean: Tensor[d], mse: 0-d Tensor)``, the mse about ``sum_i p_i Delta_i``.
    """
    d = _matrix(deltas, "deltas")
    N = d.shape[0]
    m = check_int(sampled, "sampled", 1, N)
    if math.comb(N, m) > 200_000:
        raise ValueError(f"C({N}, {m}) = {math.comb(N, m)} samples are too many to enumerate; sample instead.")
    p = _weights(weights, N, d.dtype)
    if estimator not in ("unbiased", "renormalised"):
        raise ValueError(f"estimator must be 'unbiased' or 'renormalised'; got {estimator!r}.")
    idx = torch.tensor(list(itertools.combinations(range(N), m)))  # Tensor[C, m]
    pw, dd = p[idx], d[idx]  # Tensor[C, m], Tensor[C, m, d]
    est = torch.einsum("cm,cmd->cd", pw, dd)
    est = est * (N / m) if estimator == "unbiased" else est / pw.sum(1, keepdim=True)
    full = p @ d
    return est.mean(0), ((est - full) ** 2).sum(1).mean()

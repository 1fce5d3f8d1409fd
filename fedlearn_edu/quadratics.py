"""Client drift on heterogeneous quadratics, in closed form and simulated with the package's math.

Client i holds ``f_i(x) = 1/2 (x - b_i)^T A_i (x - b_i)`` (``A_i`` symmetric positive definite);
the federation minimises ``f(x) = sum_i p_i f_i(x)``, whose minimiser is

    ``x* = (sum_i p_i A_i)^{-1} sum_i p_i A_i b_i``.

``K_i`` local gradient steps of size ``eta`` from ``x`` give ``y_i - b_i = (I - eta A_i)^{K_i} (x - b_i)``,
so the client update is ``Delta_i(x) = M_i (b_i - x)`` with ``M_i = I - (I - eta A_i)^{K_i}``.
FedAvg's fixed point solves ``sum_i p_i M_i (b_i - x) = 0``:

    ``x_FedAvg = (sum_i p_i M_i)^{-1} sum_i p_i M_i b_i``,

which is ``x*`` for ``K_i = 1`` but not in general (``M_i`` is not proportional to ``A_i``):
the clients drift towards their own optima and FedAvg solves the wrong problem. FedNova
divides ``Delta_i`` by ``K_i`` (``M_i / K_i -> eta A_i`` as ``eta -> 0``, which removes
the inconsistency from unequal ``K_i`` to first order); SCAFFOLD's control variates and
FedDyn's linear terms remove the drift itself: their fixed point is ``x*`` for the uniform
weights ``p_i = 1/N`` the papers use.

:func:`simulate_quadratics` runs the four methods with full participation, using the same
pure functions the strategies use (:mod:`fedlearn_edu.aggregators`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregators import (
    fedavg,
    feddyn_client_update,
    feddyn_server_update,
    fednova_aggregate,
    scaffold_control_update,
    scaffold_server_update,
)
from .checks import check_int, check_positive, check_range

__all__ = [
    "make_quadratics",
    "global_optimum",
    "local_gd",
    "fedavg_fixed_point",
    "fednova_fixed_point",
    "simulate_quadratics",
]

METHODS = ("fedavg", "fednova", "scaffold", "feddyn")


def make_quadratics(
    num_clients: int = 5, dim: int = 2, seed: int = 0, condition: float = 10.0, spread: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Random heterogeneous quadratics: ``A_i = Q_i diag(lambda_i) Q_i^T``, ``b_i ~ N(0, spread^2 I)``.

    The eigenvalues ``lambda_i`` are uniform in ``[1, condition]`` and ``Q_i`` a random rotation,
    so the clients disagree on both their optimum and their curvature.

    Args:
        num_clients: N >= 1.
        dim: d >= 1.
        seed: same seed, same problem.
        condition: largest eigenvalue (smallest is 1), >= 1.
        spread: standard deviation of the optima ``b_i``.

    Returns:
        ``(A, b)``: ``Tensor[N, d, d]`` and ``Tensor[N, d]``, float64.

    Example:
        >>> A, b = make_quadratics(3, 2, seed=0)
        >>> A.shape, b.shape, bool((torch.linalg.eigvalsh(A) >= 1 - 1e-12).all())
        (torch.Size([3, 2, 2]), torch.Size([3, 2]), True)
    """
    num_clients, dim = check_int(num_clients, "num_clients", 1), check_int(dim, "dim", 1)
    condition = check_range(condition, "condition", 1)
    spread = check_positive(spread, "spread", allow_zero=True)
    g = torch.Generator().manual_seed(int(seed))
    dt = torch.float64
    eig = 1 + (condition - 1) * torch.rand(num_clients, dim, generator=g, dtype=dt)
    Q, R = torch.linalg.qr(torch.randn(num_clients, dim, dim, generator=g, dtype=dt))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar-distributed rotation
    A = Q @ torch.diag_embed(eig) @ Q.transpose(-1, -2)
    A = (A + A.transpose(-1, -2)) / 2
    b = spread * torch.randn(num_clients, dim, generator=g, dtype=dt)
    return A, b


def _check_problem(A: Tensor, b: Tensor) -> tuple[int, int]:
    if not isinstance(A, Tensor) or not isinstance(b, Tensor):
        raise TypeError("A and b must be torch.Tensors: Tensor[N, d, d] and Tensor[N, d].")
    if A.dim() != 3 or A.shape[1] != A.shape[2] or b.shape != A.shape[:2]:
        raise ValueError(f"A must be Tensor[N, d, d] and b Tensor[N, d]; got {tuple(A.shape)} and {tuple(b.shape)}.")
    if not bool(torch.allclose(A, A.transpose(-1, -2))):
        raise ValueError("every A_i must be symmetric.")
    return A.shape[0], A.shape[1]


def _probabilities(weights, n: int, dtype: torch.dtype) -> Tensor:
    if weights is None:
        return torch.full((n,), 1.0 / n, dtype=dtype)
    w = torch.as_tensor(weights, dtype=dtype)
    if w.shape != (n,) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or not float(w.sum()) > 0:
        raise ValueError(f"weights must be Tensor[N] (N = {n}), finite, >= 0, with a positive sum.")
    return w / w.sum()


def _steps(local_steps, n: int) -> Tensor:
    K = torch.as_tensor(local_steps)
    if K.is_floating_point() or K.dtype == torch.bool:
        raise ValueError(f"local_steps must be integers (an int or Tensor[N]); got {K.dtype}.")
    K = K.expand(n).clone() if K.dim() == 0 else K
    if K.shape != (n,) or bool((K < 1).any()):
        raise ValueError(f"local_steps must be an int >= 1 or Tensor[N] of them (N = {n}); got {K.tolist()}.")
    return K.long()


def global_optimum(A: Tensor, b: Tensor, weights=None) -> Tensor:
    """``x* = (sum_i p_i A_i)^{-1} sum_i p_i A_i b_i``, the minimiser of ``sum_i p_i f_i``.

    Args:
        A: ``Tensor[N, d, d]`` the clients' curvatures.
        b: ``Tensor[N, d]`` the clients' optima.
        weights: ``Tensor[N]`` client weights ``p`` (default: equal).

    Returns:
        ``Tensor[d]``.

    Example:
        >>> A = torch.stack([torch.eye(2), 3 * torch.eye(2)]).double()
        >>> global_optimum(A, torch.tensor([[0.0, 0.0], [4.0, 4.0]], dtype=torch.float64))
        tensor([3., 3.], dtype=torch.float64)
    """
    n, _ = _check_problem(A, b)
    p = _probabilities(weights, n, A.dtype)
    H = torch.einsum("i,ijk->jk", p, A)
    return torch.linalg.solve(H, torch.einsum("i,ijk,ik->j", p, A, b))


def _drift_matrices(A: Tensor, local_steps, lr: float) -> Tensor:
    """``M_i = I - (I - eta A_i)^{K_i}``, ``Tensor[N, d, d]``."""
    n, d = A.shape[:2]
    K = _steps(local_steps, n)
    eye = torch.eye(d, dtype=A.dtype).expand(n, d, d)
    step = eye - lr * A
    return eye - torch.stack([torch.linalg.matrix_power(step[i], int(K[i])) for i in range(n)])


def _fixed_point(A: Tensor, b: Tensor, local_steps, lr: float, weights, normalise: bool) -> Tensor:
    n, _ = _check_problem(A, b)
    lr = check_positive(lr, "lr")
    p = _probabilities(weights, n, A.dtype)
    if normalise:
        p = p / _steps(local_steps, n).to(A.dtype)
    M = _drift_matrices(A, local_steps, lr)
    return torch.linalg.solve(torch.einsum("i,ijk->jk", p, M), torch.einsum("i,ijk,ik->j", p, M, b))


def fedavg_fixed_point(A: Tensor, b: Tensor, local_steps, lr: float, weights=None) -> Tensor:
    """FedAvg's fixed point with ``K_i`` local GD steps: ``(sum_i p_i M_i)^{-1} sum_i p_i M_i b_i``.

    Args:
        A: ``Tensor[N, d, d]`` the clients' curvatures.
        b: ``Tensor[N, d]`` the clients' optima.
        local_steps: ``K_i``, an int or integer ``Tensor[N]``.
        lr: the local step size ``eta``.
        weights: ``Tensor[N]`` client weights ``p`` (default: equal).

    Returns:
        ``Tensor[d]``.

    Example:
        >>> A, b = make_quadratics(4, 2, seed=1)
        >>> bool(torch.allclose(fedavg_fixed_point(A, b, 1, 0.05), global_optimum(A, b)))  # K = 1: no drift
        True
    """
    return _fixed_point(A, b, local_steps, lr, weights, normalise=False)


def fednova_fixed_point(A: Tensor, b: Tensor, local_steps, lr: float, weights=None) -> Tensor:
    """FedNova's fixed point (plain local GD): ``(sum_i p_i M_i / K_i)^{-1} sum_i p_i M_i b_i / K_i``.

    Args:
        A: ``Tensor[N, d, d]`` the clients' curvatures.
        b: ``Tensor[N, d]`` the clients' optima.
        local_steps: ``K_i``, an int or integer ``Tensor[N]``; FedNova divides client i's update by it.
        lr: the local step size ``eta`` of plain local GD.
        weights: ``Tensor[N]`` client weights ``p`` (default: equal).

    Returns:
        ``Tensor[d]``.
    """
    return _fixed_point(A, b, local_steps, lr, weights, normalise=True)


def local_gd(
    A: Tensor, b: Tensor, x: Tensor, local_steps, lr: float, linear: Tensor | None = None, prox: float = 0.0
) -> Tensor:
    """Every client's update after ``K_i`` gradient steps on its (modified) local objective from ``x``.

    The step is ``y <- y - lr * (A_i (y - b_i) + linear_i + prox * (y - x))``: ``linear_i = c - c_i``
    is SCAFFOLD's correction, ``linear_i = -phi_i`` with ``prox = alpha`` FedDyn's local problem.

    Args:
        A: the clients' curvatures, ``Tensor[N, d, d]``.
        b: the clients' optima b_i, ``Tensor[N, d]``.
        x: the server model, ``Tensor[d]``.
        local_steps: ``K_i``, an int or integer ``Tensor[N]``.
        lr: the local step size.
        linear: optional ``Tensor[N, d]`` constant added to every client's gradient.
        prox: coefficient of the proximal pull towards ``x``.

    Returns:
        ``Delta_i = y_i - x``, ``Tensor[N, d]``.
    """
    n, d = _check_problem(A, b)
    K = _steps(local_steps, n)
    y = x.expand(n, d).clone()
    for k in range(int(K.max())):
        grad = torch.einsum("ijk,ik->ij", A, y - b) + prox * (y - x)
        if linear is not None:
            grad = grad + linear
        y = torch.where((k < K).unsqueeze(1), y - lr * grad, y)
    return y - x


def simulate_quadratics(
    method: str,
    A: Tensor,
    b: Tensor,
    rounds: int,
    local_steps,
    lr: float,
    *,
    weights=None,
    alpha: float = 1.0,
    x0: Tensor | None = None,
) -> Tensor:
    """Run FedAvg, FedNova, SCAFFOLD (option II) or FedDyn on the quadratics, every client every round.

    Args:
        method: ``"fedavg"``, ``"fednova"``, ``"scaffold"`` or ``"feddyn"``.
        A: the clients' curvatures ``Tensor[N, d, d]`` (:func:`make_quadratics`).
        b: the clients' optima b_i, ``Tensor[N, d]``.
        rounds: number of rounds.
        local_steps: ``K_i``, an int or integer ``Tensor[N]``.
        lr: the clients' step size (the server step is 1).
        weights: the data weights ``p_i`` of FedAvg and FedNova (uniform if None); SCAFFOLD and
            FedDyn use the papers' uniform mean.
        alpha: FedDyn's regularisation strength.
        x0: the starting model (zeros if None).

    Returns:
        ``Tensor[rounds + 1, d]``: the server model before the first and after every round.

    Example:
        >>> A, b = make_quadratics(4, 2, seed=1)
        >>> x = simulate_quadratics("scaffold", A, b, rounds=300, local_steps=5, lr=0.05)
        >>> bool(torch.allclose(x[-1], global_optimum(A, b)))
        True
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    n, d = _check_problem(A, b)
    rounds = check_int(rounds, "rounds", 0)
    lr = check_positive(lr, "lr")
    K = _steps(local_steps, n)
    p = _probabilities(weights, n, A.dtype)
    x = torch.zeros(d, dtype=A.dtype) if x0 is None else torch.as_tensor(x0, dtype=A.dtype).clone()
    if x.shape != (d,):
        raise ValueError(f"x0 must be Tensor[d] with d = {d}; got {tuple(x.shape)}.")
    c_i, c = torch.zeros(n, d, dtype=A.dtype), torch.zeros(d, dtype=A.dtype)  # SCAFFOLD's controls, FedDyn's phi_i, h
    path = [x.clone()]
    for _ in range(rounds):
        if method == "fedavg":
            x = x + fedavg(local_gd(A, b, x, K, lr), p)
        elif method == "fednova":
            x = x + fednova_aggregate(local_gd(A, b, x, K, lr), K, p)
        elif method == "scaffold":
            deltas = local_gd(A, b, x, K, lr, linear=c - c_i)
            new_c_i = scaffold_control_update(c_i, c, deltas, K, lr)
            step, c = scaffold_server_update(deltas, new_c_i - c_i, c, num_clients=n)
            x, c_i = x + step, new_c_i
        else:
            deltas = local_gd(A, b, x, K, lr, linear=-c_i, prox=alpha)
            c_i = feddyn_client_update(c_i, deltas, alpha)
            step, c = feddyn_server_update(deltas, c, alpha, num_clients=n)
            x = x + step
        path.append(x.clone())
    return torch.stack(path)

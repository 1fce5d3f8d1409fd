"""FedDyn's dynamic regulariser (Acar et al., ICLR 2021, Algorithm 1): pure functions.

Client k keeps the linear term ``phi_k`` (zero at the start; the paper writes it
``grad L_k(theta_k^{t-1})``, which it equals when the previous local problem was solved exactly);
the server keeps ``h`` (zero at the start). In round t a selected client (approximately) minimises

    ``L_k(theta) - <phi_k, theta> + (alpha/2) ||theta - theta^{t-1}||^2``

(``proximal_term(theta, theta^{t-1}, alpha) + linear_term(theta, -phi_k)`` of
:mod:`fedlearn_edu.local_objectives`), starting from ``theta^{t-1}``, and
then updates its linear term from the first-order condition of that problem,

    ``phi_k <- phi_k - alpha (theta_k^t - theta^{t-1})``.

With an exact minimiser the new ``phi_k`` is ``grad L_k(theta_k^t)``; after K local SGD steps it
is ``grad L_k(theta_k^t) - r_k``, ``r_k`` the local objective's gradient where the steps stopped.
(``phi_k`` is not a pseudo-gradient ``g_i = -Delta_i``; the book's notation keeps them apart.)

The server sets ``h <- h - alpha (1/N) sum_{k in P_t} (theta_k^t - theta^{t-1})`` and
``theta^t = (1/|P_t|) sum_{k in P_t} theta_k^t - h / alpha``.

Client quantities are ``Tensor[m, d]`` or dicts of ``Tensor[m, ...]``; server quantities
have the same structure without the client axis.
"""

from __future__ import annotations

import torch

from ..checks import (
    Updates,
    check_bool,
    check_num_clients,
    check_positive,
    check_reference,
    check_stacked_like,
    check_updates,
)
from ._tree import map_updates
from .fedavg import fedavg

__all__ = ["feddyn_client_update", "feddyn_server_update"]


def feddyn_client_update(linear_terms: Updates, deltas: Updates, alpha: float, *, finite: bool = True) -> Updates:
    """FedDyn's client state: ``phi_k+ = phi_k - alpha * Delta_k`` with ``Delta_k = theta_k^t - theta^{t-1}``.

    Args:
        linear_terms: ``phi_k`` of the selected clients, ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        deltas: ``Delta_k``, structured like ``linear_terms``.
        alpha: the regularisation strength (> 0).
        finite: refuse NaN/Inf in ``deltas``; ``False`` computes every row anyway (row k of the
            result depends on row k only), leaving a NaN row to the caller (the driver drops it).

    Returns:
        ``phi_k+``, structured like ``linear_terms`` (new tensors).

    Raises:
        TypeError: ``finite`` is not a bool (``"no"`` would read as true); malformed inputs.
        ValueError: inputs of other shapes, NaN/Inf deltas with ``finite=True``, ``alpha <= 0``.

    Example:
        >>> feddyn_client_update(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, -0.5]]), alpha=0.1)
        tensor([[0.9500, 0.0500]])
    """
    check_updates(linear_terms, "linear_terms")
    finite = check_bool(finite, "finite")
    check_stacked_like(deltas, linear_terms, "deltas", "linear_terms", finite=finite)
    a = check_positive(alpha, "alpha")
    return map_updates(lambda g, d: g - a * d, linear_terms, deltas)


def feddyn_server_update(
    deltas: Updates, server_state: Updates, alpha: float, num_clients: int, weights=None, *, check: bool = True
) -> tuple[Updates, Updates]:
    """FedDyn's server step: ``h+ = h - (alpha/N) sum_S Delta_k``, ``theta^t = mean_S theta_k - h+/alpha``.

    Returned as a direction from ``theta^{t-1}``: ``direction = mean_S Delta_k - h+/alpha``, so
    that ``theta^t = theta^{t-1} + direction`` (a server learning rate other than 1 is not
    FedDyn). With ``weights`` (FedVG on FedDyn) the mean becomes ``sum_S p_k Delta_k``,
    ``p = weights / sum(weights)``; ``h`` keeps the paper's ``1/N``.

    Args:
        deltas: ``Delta_k = theta_k^t - theta^{t-1}``, ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        server_state: ``h``, ``Tensor[d]`` or dict of ``Tensor[...]``.
        alpha: the regularisation strength used by the clients (> 0).
        num_clients: N, the number of clients in the federation.
        weights: optional ``Tensor[m]`` non-negative weights (uniform if None).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``(direction, new_server_state)``, both shaped like ``server_state``.

    Example:
        >>> d = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> feddyn_server_update(d, torch.zeros(2), alpha=0.5, num_clients=2)
        (tensor([1., 1.]), tensor([-0.2500, -0.2500]))
    """
    m = check_updates(deltas, "deltas", finite=check)
    if server_state is None:
        raise TypeError("server_state must be given (zeros at the start of training).")
    check_reference(server_state, deltas, "server_state")
    a = check_positive(alpha, "alpha")
    n = check_num_clients(num_clients, m)
    new_state = map_updates(lambda h, d: h - (a / n) * d.sum(0), server_state, deltas)
    mean = fedavg(deltas, torch.ones(m, dtype=torch.float64) if weights is None else weights, check=False)
    direction = map_updates(lambda avg, h: avg - h / a, mean, new_state)
    return direction, new_state

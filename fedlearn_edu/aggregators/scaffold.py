"""SCAFFOLD's control variates (Karimireddy et al., ICML 2020, Algorithm 1): pure functions.

Server model ``x``, server control ``c``, client controls ``c_i`` (all zero at the start).
A selected client starts from ``y_i = x`` and takes ``K_i`` local steps of size ``eta_l``
along the corrected gradient ``g_i(y_i) - c_i + c`` (the local-objective term is
``linear_term(y, c - c_i)`` of :mod:`fedlearn_edu.local_objectives`). Then, with option II,

    ``c_i+ = c_i - c + (x - y_i) / (K_i eta_l)``,
    ``Delta y_i = y_i - x``,  ``Delta c_i = c_i+ - c_i``,

and the server sets ``x <- x + eta_g (1/|S|) sum_S Delta y_i`` and
``c <- c + (|S|/N) (1/|S|) sum_S Delta c_i = c + (1/N) sum_S Delta c_i``.

Client quantities are ``Tensor[m, d]`` or dicts of ``Tensor[m, ...]`` (one row per
selected client); server quantities have the same structure without the client axis.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import (
    Updates,
    check_bool,
    check_counts,
    check_num_clients,
    check_positive,
    check_reference,
    check_stacked_like,
    check_updates,
)
from ._tree import map_updates
from .fedavg import fedavg

__all__ = ["scaffold_control_update", "scaffold_server_update"]


def _per_client(values: Tensor, t: Tensor) -> Tensor:
    """``values: Tensor[m]`` shaped to broadcast against ``t: Tensor[m, ...]``."""
    return values.to(device=t.device, dtype=t.dtype).reshape((-1,) + (1,) * (t.dim() - 1))


def scaffold_control_update(
    client_controls: Updates, server_control: Updates, deltas: Updates, local_steps, lr, *, finite: bool = True
) -> Updates:
    """SCAFFOLD's option-II control variates: ``c_i+ = c_i - c + (x - y_i) / (K_i eta_l)``.

    ``(x - y_i) / (K_i eta_l) = -Delta y_i / (K_i eta_l)`` is the average corrected gradient
    along the client's path, so ``c_i+ = mean_k g_i(y_i^k)``: the client's own gradient,
    re-estimated for free from the update it already computed.

    Args:
        client_controls: ``c_i`` of the selected clients, ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        server_control: ``c``, ``Tensor[d]`` or dict of ``Tensor[...]``.
        deltas: ``Delta y_i = y_i - x``, structured like ``client_controls``.
        local_steps: ``K_i``, a number or ``Tensor[m]`` (> 0).
        lr: the local learning rate ``eta_l`` (> 0).
        finite: refuse NaN/Inf in ``deltas``; ``False`` computes every row anyway (row i of the
            result depends on row i only), leaving a NaN row to the caller (the driver drops it).

    Returns:
        ``c_i+``, structured like ``client_controls`` (new tensors; the inputs are not modified).

    Raises:
        TypeError: ``finite`` is not a bool (``"no"`` would read as true); malformed inputs.
        ValueError: inputs of other shapes, NaN/Inf deltas with ``finite=True``, a bad ``lr``
            or ``local_steps``.

    Example:
        >>> c_i, c = torch.tensor([[0.0, 1.0]]), torch.tensor([0.5, 0.5])
        >>> scaffold_control_update(c_i, c, torch.tensor([[-0.2, 0.4]]), local_steps=2, lr=0.1)
        tensor([[ 0.5000, -1.5000]])
    """
    m = check_updates(client_controls, "client_controls")
    finite = check_bool(finite, "finite")
    check_stacked_like(deltas, client_controls, "deltas", "client_controls", finite=finite)
    check_reference(server_control, client_controls, "server_control")
    if server_control is None:
        raise TypeError("server_control must be given (zeros at the start of training).")
    steps = check_counts(local_steps, m, "local_steps")
    eta = check_positive(lr, "lr")
    scale = 1.0 / (steps * eta)
    return map_updates(lambda ci, c, d: ci - c - _per_client(scale, d) * d, client_controls, server_control, deltas)


def scaffold_server_update(
    deltas: Updates,
    control_deltas: Updates,
    server_control: Updates,
    num_clients: int,
    weights=None,
    *,
    check: bool = True,
) -> tuple[Updates, Updates]:
    """SCAFFOLD's server step: the model direction and the new server control.

    ``direction = (1/|S|) sum_S Delta y_i`` (the server sets ``x <- x + eta_g * direction``)
    and ``c+ = c + (1/N) sum_S Delta c_i``. With ``weights`` (e.g. FedVG's) the direction is
    ``sum_S p_i Delta y_i`` with ``p = weights / sum(weights)``; the control update keeps the
    paper's ``1/N``, so that ``c`` stays the mean of all N client controls.

    Args:
        deltas: ``Delta y_i``, ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        control_deltas: ``Delta c_i = c_i+ - c_i``, structured like ``deltas``.
        server_control: ``c``, ``Tensor[d]`` or dict of ``Tensor[...]``.
        num_clients: N, the number of clients in the federation (not only the selected).
        weights: optional ``Tensor[m]`` non-negative weights of the direction (uniform if None).
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``(direction, new_server_control)``, both shaped like ``server_control``.

    Example:
        >>> dy = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> dc = torch.tensor([[0.4, 0.0], [0.0, -0.4]])
        >>> scaffold_server_update(dy, dc, torch.zeros(2), num_clients=4)
        (tensor([0.5000, 0.5000]), tensor([ 0.1000, -0.1000]))
    """
    m = check_updates(deltas, "deltas", finite=check)
    check_stacked_like(control_deltas, deltas, "control_deltas", "deltas")
    if server_control is None:
        raise TypeError("server_control must be given (zeros at the start of training).")
    check_reference(server_control, deltas, "server_control")
    n = check_num_clients(num_clients, m)
    direction = fedavg(deltas, torch.ones(m, dtype=torch.float64) if weights is None else weights, check=False)
    new_control = map_updates(lambda c, dc: c + dc.sum(0) / n, server_control, control_deltas)
    return direction, new_control

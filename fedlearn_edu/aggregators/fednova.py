"""FedNova's normalised averaging (Wang et al., NeurIPS 2020): pure functions.

Client i's cumulative update after ``tau_i`` local steps is ``Delta_i = -eta G_i a_i``, with
``G_i`` its stacked stochastic gradients and ``a_i`` the vector of how much each gradient
counts. Plain averaging ``sum_i p_i Delta_i`` weighs clients by ``||a_i||_1`` as well as by
``p_i`` -- a client that takes more steps pulls the model towards its own optimum, and the
federation minimises ``sum_i p_i ||a_i||_1 F_i`` instead of ``sum_i p_i F_i`` (objective
inconsistency). FedNova divides each update by ``||a_i||_1`` and rescales by
``tau_eff = sum_i p_i ||a_i||_1``:

    ``direction = tau_eff * sum_i p_i Delta_i / ||a_i||_1``;   ``x <- x + direction``.

``||a_i||_1`` (the paper's Section 4 and Appendix):

* plain local SGD: ``tau_i``;
* local SGD with (heavy-ball) momentum ``rho``: ``[tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)``;
* FedProx's proximal term (``alpha = eta_l mu``): ``[1 - (1 - alpha)^tau_i] / alpha``.

**Where this follows the authors' code rather than the formula above.** With a proximal
term the authors' ``distoptim/FedNova.py`` (github.com/JYWa/FedNova, ``FedNova.average``)
rescales by ``tau_eff = sum_i p_i tau_i``, the clients' *step counts*, not by
``sum_i p_i ||a_i||_1``; with plain SGD or momentum it uses ``sum_i p_i ||a_i||_1``. The
package does the same by default (``prox_tau_eff="steps"``); ``prox_tau_eff="norms"`` gives
``sum_i p_i ||a_i||_1`` in every case. The two differ only when ``proximal > 0``: the server
step is then ``sum_i p_i ||a_i||_1 / sum_i p_i tau_i < 1`` times the authors' (e.g. 0.933 for
``alpha = 0.01`` and ``tau = (5, 10, 20)`` with equal weights).

With equal ``||a_i||_1`` (e.g. every client takes the same number of plain SGD steps) the
direction is FedAvg's weighted mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import Updates, check_counts, check_range, check_updates, check_weights
from ._tree import combine

__all__ = ["fednova_norms", "fednova_tau_eff", "fednova_aggregate"]


def fednova_norms(local_steps, momentum: float = 0.0, proximal: float = 0.0) -> Tensor:
    """``||a_i||_1``, each client's effective number of local steps.

    Args:
        local_steps: ``tau_i``, a number or ``Tensor[m]`` (> 0).
        momentum: the clients' momentum ``rho`` in [0, 1) (0: plain SGD).
        proximal: ``alpha = eta_l * mu`` of FedProx's proximal term, in [0, 1) (0: none).

    Returns:
        ``Tensor[m]`` (float64) of ``||a_i||_1``.

    Example:
        >>> fednova_norms(torch.tensor([1, 2, 4]))
        tensor([1., 2., 4.], dtype=torch.float64)
        >>> fednova_norms(torch.tensor([2]), momentum=0.5)  # a = (1, 1 + 0.5)
        tensor([2.5000], dtype=torch.float64)
    """
    t = torch.as_tensor(local_steps)
    tau = check_counts(t, 1 if t.dim() == 0 else t.shape[0], "local_steps")
    rho = check_range(momentum, "momentum", 0, 1, high_open=True)
    alpha = check_range(proximal, "proximal", 0, 1, high_open=True, why="(eta_l * mu)")
    if rho > 0 and alpha > 0:
        raise ValueError(
            "FedNova's closed form covers momentum or a proximal term, not both: set momentum=0 or proximal=0."
        )
    if rho > 0:
        return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    if alpha > 0:
        return (1 - (1 - alpha) ** tau) / alpha
    return tau


PROX_TAU_EFF = ("steps", "norms")


def fednova_tau_eff(local_steps, weights, momentum: float = 0.0, proximal: float = 0.0, prox_tau_eff: str = "steps"):
    """``tau_eff``, the length FedNova rescales the normalised average to (a float64 scalar tensor).

    ``sum_i p_i ||a_i||_1``, except with a proximal term (``proximal > 0``) and
    ``prox_tau_eff="steps"`` (the default, as the authors' code): ``sum_i p_i tau_i``.

    Args:
        local_steps: ``tau_i``, a number or ``Tensor[m]`` of positive step counts.
        weights: ``Tensor[m]`` client weights (normalised to ``p``).
        momentum: local SGD momentum ``rho`` in [0, 1).
        proximal: ``eta_l * mu`` in [0, 1) (FedProx's term).
        prox_tau_eff: ``"steps"`` (``sum_i p_i tau_i``, the authors' code) or ``"norms"``
            (``sum_i p_i ||a_i||_1``) when ``proximal > 0``.

    Returns:
        ``tau_eff``, a float64 scalar ``Tensor``.

    Example:
        >>> float(fednova_tau_eff(torch.tensor([2, 4]), torch.ones(2), proximal=0.5))   # authors: (2 + 4) / 2
        3.0
        >>> float(fednova_tau_eff(torch.tensor([2, 4]), torch.ones(2), proximal=0.5, prox_tau_eff="norms"))
        1.6875
    """
    t = torch.as_tensor(local_steps)
    norms = fednova_norms(t, momentum=momentum, proximal=proximal)
    w = check_weights(weights, norms.shape[0]).to(torch.float64).cpu()
    return _tau_eff(t, w / w.sum(), norms, proximal, prox_tau_eff)


def _tau_eff(local_steps: Tensor, p: Tensor, norms: Tensor, proximal: float, prox_tau_eff: str) -> Tensor:
    """:func:`fednova_tau_eff` from the already checked weights ``p`` and norms ``||a_i||_1``."""
    if prox_tau_eff not in PROX_TAU_EFF:
        raise ValueError(f"prox_tau_eff must be one of {PROX_TAU_EFF}, got {prox_tau_eff!r}.")
    if proximal > 0 and prox_tau_eff == "steps":
        return (p * local_steps.to(torch.float64).cpu().reshape(norms.shape)).sum()
    return (p * norms).sum()


def fednova_aggregate(
    deltas: Updates,
    local_steps,
    weights,
    momentum: float = 0.0,
    proximal: float = 0.0,
    prox_tau_eff: str = "steps",
    *,
    check: bool = True,
) -> Updates:
    """FedNova's direction ``tau_eff * sum_i p_i Delta_i / ||a_i||_1`` (``tau_eff``: :func:`fednova_tau_eff`).

    Args:
        deltas: client updates ``Delta_i = x_i - x``, ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``.
        local_steps: ``tau_i``, a number or ``Tensor[m]`` (> 0).
        weights: ``Tensor[m]`` non-negative data weights (``n_i``); ``p = weights / sum(weights)``.
        momentum: the clients' momentum ``rho`` (see :func:`fednova_norms`).
        proximal: FedProx's ``eta_l * mu`` (see :func:`fednova_norms`).
        prox_tau_eff: with ``proximal > 0``, ``"steps"`` (default, the authors' code):
            ``tau_eff = sum_i p_i tau_i``; ``"norms"``: ``sum_i p_i ||a_i||_1``.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[d]`` or a dict of ``Tensor[...]``; the server sets ``x <- x + eta_g * direction``.

    Example:
        >>> d = torch.tensor([[1.0, 0.0], [0.0, 4.0]])
        >>> fednova_aggregate(d, torch.tensor([1, 4]), torch.tensor([1.0, 1.0]))  # tau_eff = 2.5
        tensor([1.2500, 1.2500])
    """
    m = check_updates(deltas, "deltas", finite=check)
    steps = check_counts(local_steps, m, "local_steps")
    norms = fednova_norms(steps, momentum=momentum, proximal=proximal)
    w = check_weights(weights, m).to(torch.float64).cpu()
    p = w / w.sum()
    tau_eff = _tau_eff(torch.as_tensor(steps), p, norms, proximal, prox_tau_eff)
    return combine(tau_eff * p / norms, deltas)

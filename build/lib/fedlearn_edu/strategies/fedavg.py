"""The FedAvg family: FedAvg, FedAvgM (server momentum) and FedProx (proximal clients)."""

from __future__ import annotations

from ..aggregators import fedavg
from ..engine import LocalTraining
from ..params import Params
from .base import ClientUpdates, Strategy

__all__ = ["FedAvg", "FedAvgM", "FedProx"]


class FedAvg(Strategy):
    """Federated averaging (McMahan et al., 2017).

    ``theta_{t+1} = theta_t + eta_s * sum_i p_i Delta_i`` with ``p_i = n_i / sum_j n_j``
    over the selected clients.

    Example:
        >>> strategy = FedAvg(server_lr=1.0)
    """

    name = "fedavg"

    def aggregate(self, params: Params, updates: ClientUpdates) -> tuple[Params, dict]:
        step = fedavg(updates.deltas, updates.size_weights)
        new = {k: v + self.server_lr * step[k] for k, v in params.items()}
        return new, {"weights": updates.size_weights}


class FedAvgM(Strategy):
    """FedAvg with server momentum (Hsu et al., 2019) on the pseudo-gradient.

    ``v <- beta v + sum_i p_i g_i`` with ``g_i = -Delta_i``; ``theta <- theta - eta_s v``.

    Args:
        server_lr: eta_s.
        momentum: beta (0.9 by default).
    """

    name = "fedavgm"

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9):
        super().__init__(server_lr)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
        self.momentum = float(momentum)
        self._velocity: Params | None = None

    def init(self, params: Params) -> None:
        self._velocity = None

    def aggregate(self, params: Params, updates: ClientUpdates) -> tuple[Params, dict]:
        pseudo_grad = {k: -v for k, v in fedavg(updates.deltas, updates.size_weights).items()}
        if self._velocity is None:
            self._velocity = pseudo_grad
        else:
            self._velocity = {k: self.momentum * self._velocity[k] + g for k, g in pseudo_grad.items()}
        new = {k: v - self.server_lr * self._velocity[k] for k, v in params.items()}
        return new, {"weights": updates.size_weights}


class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg aggregation, clients minimise
    ``loss + (mu/2) ||w - theta_t||^2``.

    Args:
        mu: proximal coefficient (> 0).
        server_lr: eta_s.
    """

    name = "fedprox"

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0):
        super().__init__(server_lr)
        if not (mu >= 0 and mu < float("inf")):
            raise ValueError(f"mu must be a finite number >= 0, got {mu}.")
        self.mu = float(mu)

    def configure_local(self, config: LocalTraining) -> LocalTraining:
        return config.replace(prox_mu=self.mu)

"""The server side: a strategy turns a round's client updates into new global parameters.

A strategy holds what must persist between rounds (momentum, reference
directions, personal models) and calls the pure functions of
:mod:`fedlearn_edu.aggregators`. The simulator drives it through four calls::

    strategy.init(params)                              # once, before round 1
    config = strategy.configure_local(config)          # each round: client hyper-parameters
    signals = strategy.client_signals(...)             # client side: what clients report besides Delta_i
    params, diagnostics = strategy.aggregate(params, updates)   # server side
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..checks import check_float
from ..engine import LocalResult, LocalTraining
from ..params import Params

__all__ = ["ClientUpdates", "Strategy"]


@dataclass
class ClientUpdates:
    """Everything the server receives in one round from the m selected clients.

    Attributes:
        round: the round number t (1-based).
        client_ids: ``Tensor[m]`` (int64) ids of the selected clients.
        deltas: stacked updates ``{name: Tensor[m, ...]}``, ``Delta_i = theta_i - theta_t``.
        num_samples: ``Tensor[m]`` training-set sizes n_i.
        train_loss: ``Tensor[m]`` mean local training loss of each client.
        model: the architecture, for ``torch.func.functional_call`` (server-side signals).
        signals: extra per-client reports, e.g. ``{"oui": Tensor[m]}``.
    """

    round: int
    client_ids: Tensor
    deltas: Params
    num_samples: Tensor
    train_loss: Tensor
    model: nn.Module
    signals: dict = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return int(self.client_ids.shape[0])

    @property
    def size_weights(self) -> Tensor:
        """``Tensor[m]``: p_i = n_i / sum_j n_j over the selected clients."""
        n = self.num_samples.to(torch.float64)
        return (n / n.sum()).to(next(iter(self.deltas.values())).dtype)


class Strategy:
    """Base class. Subclasses override :meth:`aggregate` (and the other hooks as needed).

    Args:
        server_lr: server step size eta_s applied to the aggregated update.
    """

    name = "strategy"

    def __init__(self, server_lr: float = 1.0):
        self.server_lr = check_float(server_lr, "server_lr", positive=True)

    def init(self, params: Params) -> None:
        """Reset the server state before round 1 (called by the simulator)."""

    def configure_local(self, config: LocalTraining) -> LocalTraining:
        """The clients' local-training hyper-parameters this strategy asks for."""
        return config

    def client_signals(
        self,
        model: nn.Module,
        global_params: Params,
        local: LocalResult,
        datasets: Sequence[tuple[Tensor, Tensor]],
    ) -> dict:
        """Per-client values computed on the clients and sent with their updates (none by default)."""
        return {}

    def aggregate(self, params: Params, updates: ClientUpdates) -> tuple[Params, dict]:
        """Return ``(theta_{t+1}, diagnostics)`` from ``theta_t`` and the round's updates."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"

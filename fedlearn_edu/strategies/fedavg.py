"""The FedAvg family: FedAvg, FedProx (proximal clients) and the server optimizers on top.

All share FedAvg's direction ``g = -sum_i p_i Delta_i`` (``p_i = n_i / sum_j n_j``);
they differ in the clients' objective (FedProx) or the server optimizer that applies
``g``: FedAvgM (heavy-ball momentum), FedAdam, FedYogi and FedAdagrad (FedOpt,
Reddi et al., 2021).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..aggregators import fedavg
from ..checks import check_positive
from ..engine import LocalTraining
from ..params import Params
from .base import ClientUpdates, Needs, Strategy
from .registry import register
from .server_optim import ServerAdagrad, ServerAdam, ServerMomentum, ServerOptimizer, ServerYogi

__all__ = ["FedAvg", "FedAvgM", "FedProx", "FedAdam", "FedYogi", "FedAdagrad"]


def _refuse_optimizer(strategy: str, optimizer, named: str, example: str) -> None:
    """Refuse ``optimizer=`` for a strategy whose name is its optimizer (FedAvgM, FedAdam, ...), with the fix."""
    if optimizer is not None:
        raise TypeError(
            f"{strategy} takes no optimizer (got optimizer={optimizer!r}): its server optimizer is its name, "
            f"{named}. For FedAvg's direction under another or a composed optimizer use FedAvg(optimizer=...), "
            f"e.g. FedAvg(optimizer={example})."
        )


@register
class FedAvg(Strategy):
    """Federated averaging (McMahan et al., 2017).

    ``theta_{t+1} = theta_t + eta_s * sum_i p_i Delta_i`` with ``p_i = n_i / sum_j n_j``
    over the selected clients: the direction ``g = -sum_i p_i Delta_i`` under
    ``ServerSGD(eta_s)``; any other ``optimizer`` may apply it.

    Example:
        >>> strategy = FedAvg(server_lr=1.0)
    """

    name = "fedavg"
    needs = Needs(sums_only=True)  # sum_i n_i Delta_i and sum_i n_i

    def client_weights(self, updates: ClientUpdates) -> Tensor:
        """The weights of the clients' mean.

        Args:
            updates: the round's updates.

        Returns:
            ``Tensor[m]``, by data size (``updates.size_weights``).
        """
        return updates.size_weights

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -sum_i p_i Delta_i``; diagnostics ``weights`` (``Tensor[m]``).

        Args:
            server_state: the server state (returned unchanged).
            updates: the round's updates.

        Returns:
            ``(g, server_state, {"weights": p})``.
        """
        w = self.client_weights(updates)
        step = fedavg(updates.deltas, w, check=not updates.checked)
        return {k: -v for k, v in step.items()}, server_state, {"weights": w}


@register
class FedAvgM(FedAvg):
    """FedAvg with server momentum (Hsu et al., 2019) on the pseudo-gradient.

    ``v <- beta v + sum_i p_i g_i`` with ``g_i = -Delta_i``; ``theta <- theta - eta_s v``
    (FedAvg's direction under :class:`~fedlearn_edu.strategies.server_optim.ServerMomentum`).

    ``FedAvgM(server_lr, momentum)`` is ``FedAvg(optimizer=ServerMomentum(server_lr, momentum))``
    (the same step, bit for bit).

    Args:
        server_lr: eta_s.
        momentum: beta (0.9 by default).
        optimizer: not accepted (FedAvgM's optimizer is its name): ``FedAvg(optimizer=...)`` takes any.

    Raises:
        TypeError: ``optimizer`` is given (the message says what to use instead).
    """

    name = "fedavgm"

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9, optimizer: None = None):
        """Check the arguments (see the class docstring) and keep them."""
        _refuse_optimizer(
            "FedAvgM", optimizer, "heavy-ball momentum, ServerMomentum(server_lr, momentum)",
            "chain(clip_by_global_norm(1.0), momentum(0.9), sgd(1.0))",
        )  # fmt: skip
        super().__init__(optimizer=ServerMomentum(check_positive(server_lr, "server_lr"), momentum))

    @property
    def momentum(self) -> float:
        """The momentum beta."""
        return self.optimizer.momentum


@register
class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg aggregation, proximal clients.

    The clients minimise ``loss + (mu/2) ||w - theta_t||^2``.

    Args:
        mu: proximal coefficient (> 0).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
    """

    name = "fedprox"
    prox_argument = "mu"  # the clients' prox_mu

    def __init__(self, mu: float = 0.01, server_lr: float | None = None, optimizer: ServerOptimizer | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer)
        self.mu = check_positive(mu, "mu", allow_zero=True)

    def configure_local(self, config: LocalTraining) -> LocalTraining:
        """The clients' settings with ``prox_mu = mu``.

        Args:
            config: the run's settings for the round (not modified).

        Returns:
            A copy of ``config`` with ``prox_mu = mu``.
        """
        return config.replace(prox_mu=self.mu)


CLIENT_WEIGHTING = ("size", "uniform")


class _FedOptStrategy(FedAvg):
    """FedAvg's direction under one of the adaptive server optimizers of Reddi et al. (2021).

    ``weighting`` says how the clients' updates are averaged into the pseudo-gradient:
    ``"size"`` (default) ``g = -sum_i p_i Delta_i`` with ``p_i = n_i / sum_j n_j``, as FedAvg
    (and Flower's FedAdam/FedYogi/FedAdagrad); ``"uniform"``: ``g = -(1/|S|) sum_{i in S} Delta_i``,
    Reddi et al.'s Algorithm 2 as written. They agree when the clients hold equal amounts of data.
    """

    _optimizer: type
    _scaler: str

    def __init__(
        self,
        server_lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        weighting: str = "size",
        optimizer: None = None,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        _refuse_optimizer(
            type(self).__name__, optimizer,
            f"{self._optimizer.__name__}(server_lr, ...) = {self._scaler}(beta1, beta2, tau, lr=server_lr)",
            f"chain(clip_by_global_norm(1.0), {self._scaler}(lr=0.01))",
        )  # fmt: skip
        super().__init__(optimizer=self._optimizer(check_positive(server_lr, "server_lr"), beta1, beta2, tau))
        if weighting not in CLIENT_WEIGHTING:
            raise ValueError(f"weighting must be one of {CLIENT_WEIGHTING}, got {weighting!r}.")
        self.weighting = weighting

    def client_weights(self, updates: ClientUpdates) -> Tensor:
        """``Tensor[m]``: ``p_i`` by data size, or ``1/|S|`` with ``weighting="uniform"``."""
        if self.weighting == "size":
            return super().client_weights(updates)
        return torch.full_like(updates.size_weights, 1.0 / updates.num_clients)


@register
class FedAdam(_FedOptStrategy):
    """FedAdam (Reddi et al., 2021): Adam's moments on FedAvg's pseudo-gradient.

    ``g = -sum_i p_i Delta_i``, ``m <- b1 m + (1-b1) g``, ``v <- b2 v + (1-b2) g^2``,
    ``theta <- theta - eta_s m / (sqrt(v) + tau)`` (``m_0 = 0``, ``v_0 = tau^2``).

    The client mean is weighted by data size (``p_i = n_i / sum_j n_j``) by default; Reddi et
    al.'s Algorithm 2 takes the plain mean ``(1/|S|) sum_{i in S} Delta_i``: ``weighting="uniform"``.

    A strategy alias: ``FedAdam(server_lr, beta1, beta2, tau)`` is
    ``FedAvg(optimizer=scale_by_adam(beta1, beta2, tau, lr=server_lr))`` bit for bit (its optimizer,
    :class:`~fedlearn_edu.strategies.server_optim.ServerAdam`, is that scaler with the step first).

    Args:
        server_lr: eta_s (0.01).
        beta1, beta2: moment decay rates (0.9, 0.99).
        tau: adaptivity (1e-3).
        weighting: ``"size"`` (default) or ``"uniform"`` (Algorithm 2's ``1/|S|``).
        optimizer: not accepted (FedAdam's optimizer is its name): ``FedAvg(optimizer=...)`` takes any,
            e.g. clipped FedAdam ``FedAvg(optimizer=chain(clip_by_global_norm(C), scale_by_adam(lr=0.01)))``.

    Raises:
        TypeError: ``optimizer`` is given (the message says what to use instead).

    Example:
        >>> FedAdam(server_lr=0.03).server_lr
        0.03
    """

    name = "fedadam"
    _optimizer = ServerAdam
    _scaler = "scale_by_adam"


@register
class FedYogi(_FedOptStrategy):
    """FedYogi (Reddi et al., 2021): as :class:`FedAdam` with ``v <- v - (1-b2) g^2 sign(v - g^2)``.

    ``weighting``: ``"size"`` (default) or ``"uniform"`` (Algorithm 2's ``1/|S|``), as :class:`FedAdam`.
    """

    name = "fedyogi"
    _optimizer = ServerYogi
    _scaler = "scale_by_yogi"


@register
class FedAdagrad(_FedOptStrategy):
    """FedAdagrad (Reddi et al., 2021): as :class:`FedAdam` with ``v <- v + g^2``.

    ``weighting``: ``"size"`` (default) or ``"uniform"`` (Algorithm 2's ``1/|S|``), as :class:`FedAdam`.
    """

    name = "fedadagrad"
    _optimizer = ServerAdagrad
    _scaler = "scale_by_adagrad"

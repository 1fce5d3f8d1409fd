"""Server optimizers: how the server turns a round's direction into new global parameters.

Sign convention (the whole package): a strategy's *direction* ``g`` is a
pseudo-gradient, pointing uphill like a loss gradient. For the FedAvg family
``g = -sum_i p_i Delta_i`` with ``Delta_i = theta_i - theta_t``. A server
optimizer steps *against* it; plain SGD gives ``theta_{t+1} = theta_t - eta_s g``,
which for FedAvg is ``theta_t + eta_s sum_i p_i Delta_i``.

=========================  ==================================================================
:class:`ServerSGD`         ``theta <- theta - eta g``
:class:`ServerMomentum`    ``v <- beta v + g`` (``v_1 = g``); ``theta <- theta - eta v`` (FedAvgM)
:class:`ServerAdagrad`     ``m <- b1 m + (1-b1) g``; ``v <- v + g^2``
:class:`ServerAdam`        ``m <- b1 m + (1-b1) g``; ``v <- b2 v + (1-b2) g^2``
:class:`ServerYogi`        ``m <- b1 m + (1-b1) g``; ``v <- v - (1-b2) g^2 sign(v - g^2)``
=========================  ==================================================================

The last three are FedOpt (Reddi et al., 2021, Algorithm 2): ``m_0 = 0``,
``v_0 = tau^2`` and ``theta <- theta - eta m / (sqrt(v) + tau)``, without bias
correction, as in the paper.

An optimizer keeps its state (momentum, moments) between rounds; :meth:`init`
resets it, :meth:`state_dict` / :meth:`load_state_dict` carry it through a
checkpoint (tensors only).
"""

from __future__ import annotations

import torch

from ..checks import check_float
from ..params import Params

__all__ = ["ServerOptimizer", "ServerSGD", "ServerMomentum", "ServerAdagrad", "ServerAdam", "ServerYogi"]


def _positive(name: str, value: float) -> float:
    return check_float(value, name, positive=True)


def _unit_interval(name: str, value: float) -> float:
    value = check_float(value, name)
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value}.")
    return float(value)


class ServerOptimizer:
    """Base class: ``step(params, direction) -> new params``; subclasses keep their state.

    Args:
        lr: the server step size eta_s (> 0).
    """

    _state_names: tuple[str, ...] = ()

    def __init__(self, lr: float = 1.0):
        self.lr = _positive("server_lr", lr)
        self.init()

    def init(self, params: Params | None = None) -> None:
        """Forget the state (before round 1)."""
        for name in self._state_names:
            setattr(self, name, None)

    def step(self, params: Params, direction: Params) -> Params:
        """The new parameters from ``params`` (``{name: Tensor}``) and the pseudo-gradient ``direction``."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The optimizer's state: ``{name: None or {param name: Tensor}}``."""
        return {name: getattr(self, name) for name in self._state_names}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`."""
        missing = set(self._state_names) - set(state)
        if missing:
            raise ValueError(f"{type(self).__name__}: the saved state lacks {sorted(missing)}.")
        for name in self._state_names:
            setattr(self, name, state[name])

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class ServerSGD(ServerOptimizer):
    """``theta <- theta - eta g``.

    Example:
        >>> ServerSGD(0.5).step({"w": torch.ones(2)}, {"w": torch.tensor([2.0, -2.0])})
        {'w': tensor([0., 2.])}
    """

    def step(self, params: Params, direction: Params) -> Params:
        return {k: v - self.lr * direction[k] for k, v in params.items()}


class ServerMomentum(ServerOptimizer):
    """Heavy-ball server momentum (FedAvgM, Hsu et al., 2019): ``v <- beta v + g``, ``theta <- theta - eta v``.

    Args:
        lr: eta_s.
        momentum: beta in [0, 1) (0.9 by default).
    """

    _state_names = ("_velocity",)

    def __init__(self, lr: float = 1.0, momentum: float = 0.9):
        self.momentum = _unit_interval("momentum", momentum)
        super().__init__(lr)

    def step(self, params: Params, direction: Params) -> Params:
        if self._velocity is None:
            self._velocity = direction
        else:
            self._velocity = {k: self.momentum * self._velocity[k] + g for k, g in direction.items()}
        return {k: v - self.lr * self._velocity[k] for k, v in params.items()}


class _FedOpt(ServerOptimizer):
    """Adaptive server optimizers of Reddi et al. (2021): shared first moment and step."""

    _state_names = ("_m", "_v")

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        self.beta1 = _unit_interval("beta1", beta1)
        self.beta2 = _unit_interval("beta2", beta2)
        self.tau = _positive("tau", tau)
        super().__init__(lr)

    def _second_moment(self, v: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, params: Params, direction: Params) -> Params:
        if self._m is None:
            self._m = {k: torch.zeros_like(g) for k, g in direction.items()}
            self._v = {k: torch.full_like(g, self.tau**2) for k, g in direction.items()}
        self._m = {k: self.beta1 * self._m[k] + (1 - self.beta1) * g for k, g in direction.items()}
        self._v = {k: self._second_moment(self._v[k], g * g) for k, g in direction.items()}
        return {k: p - self.lr * self._m[k] / (self._v[k].sqrt() + self.tau) for k, p in params.items()}


class ServerAdagrad(_FedOpt):
    """FedAdagrad's server step: ``v <- v + g^2`` (``beta2`` unused)."""

    def _second_moment(self, v, g2):
        return v + g2


class ServerAdam(_FedOpt):
    """FedAdam's server step: ``v <- beta2 v + (1 - beta2) g^2``."""

    def _second_moment(self, v, g2):
        return self.beta2 * v + (1 - self.beta2) * g2


class ServerYogi(_FedOpt):
    """FedYogi's server step: ``v <- v - (1 - beta2) g^2 sign(v - g^2)``."""

    def _second_moment(self, v, g2):
        return v - (1 - self.beta2) * g2 * torch.sign(v - g2)

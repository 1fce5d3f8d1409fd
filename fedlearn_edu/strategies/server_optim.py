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

An optimizer is pure: it holds only its hyper-parameters. Its state (momentum, moments)
is created by :meth:`ServerOptimizer.init_state` and passed in and returned by
:meth:`ServerOptimizer.step`; the strategy keeps it in the server state
(``server_state["optimizer"]``), which the driver checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..checks import check_positive, check_range
from ..params import Params

__all__ = ["ServerOptimizer", "ServerSGD", "ServerMomentum", "ServerAdagrad", "ServerAdam", "ServerYogi"]


class ServerOptimizer:
    """Base class: ``step(params, direction, state) -> (new params, new state)``, no state on ``self``.

    Args:
        lr: the server step size eta_s (> 0).
    """

    def __init__(self, lr: float = 1.0):
        """Check the arguments (see the class docstring) and keep them."""
        self.lr = check_positive(lr, "server_lr")

    def init_state(self, params: Params) -> dict:
        """The optimizer's state before round 1.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}`` (one model, or K
                stacked ones ``Tensor[K, ...]``).

        Returns:
            ``{name: {param name: Tensor[...]}}`` shaped like ``params`` (``{}`` for SGD).
        """
        return {}

    def step(self, params: Params, direction: Params, state: dict) -> tuple[Params, dict]:
        """One server step.

        Args:
            params: theta_t, ``{name: Tensor[...]}``.
            direction: the pseudo-gradient ``g``, shaped like ``params``.
            state: the optimizer's state (:meth:`init_state`, or the previous step's); not modified.

        Returns:
            ``(theta_{t+1}, new state)``.

        Raises:
            ValueError: ``direction`` (or a moment of ``state``) lacks a parameter of ``params``,
                has another one, or one of another shape (every subclass checks with
                :meth:`check_step`).
        """
        raise NotImplementedError

    def check_step(self, params: Params, direction: Params, state: dict) -> None:
        """Refuse a ``direction`` or ``state`` that does not match ``params`` (names and shapes).

        Without it a missing name ends in a bare ``KeyError`` and a shape of size 1 is silently
        broadcast over the parameter.

        Args:
            params: theta_t, ``{name: Tensor[...]}``.
            direction: ``g``, which must have exactly the names and shapes of ``params``.
            state: ``{moment: {name: Tensor[...]}}``; every moment :meth:`init_state` makes
                must be there, shaped like ``params``.

        Raises:
            ValueError: a name missing or unexpected, or a shape that differs.
        """
        expected = {k: tuple(v.shape) for k, v in params.items()}
        trees = [("direction", direction)]
        for moment in self.init_state({}):
            if not isinstance(state.get(moment), Mapping):
                raise ValueError(
                    f"{type(self).__name__}.step needs state[{moment!r}] (from init_state(params)); the state "
                    f"has {sorted(state)}."
                )
            trees.append((f"state[{moment!r}]", state[moment]))
        for what, tree in trees:
            missing, unknown = sorted(set(expected) - set(tree)), sorted(set(tree) - set(expected))
            if missing or unknown:
                raise ValueError(
                    f"{type(self).__name__}.step: {what} must have the names of params {sorted(expected)}; "
                    f"missing {missing[:5]}, unexpected {unknown[:5]}."
                )
            for k, shape in expected.items():
                if tuple(tree[k].shape) != shape:
                    raise ValueError(
                        f"{type(self).__name__}.step: {what}[{k!r}] has shape {tuple(tree[k].shape)}, "
                        f"params[{k!r}] has {shape}."
                    )

    def __repr__(self) -> str:
        """``Name(hyper-parameter=value, ...)``."""
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class ServerSGD(ServerOptimizer):
    """``theta <- theta - eta g``.

    Example:
        >>> ServerSGD(0.5).step({"w": torch.ones(2)}, {"w": torch.tensor([2.0, -2.0])}, {})
        ({'w': tensor([0., 2.])}, {})
    """

    def step(self, params: Params, direction: Params, state: dict) -> tuple[Params, dict]:
        """``theta - eta g``; the state stays ``{}``.

        Args:
            params: theta_t, ``{name: Tensor[...]}``.
            direction: ``g``, shaped like ``params``.
            state: ``{}`` (SGD keeps no state); returned as given.

        Returns:
            ``(theta_t - eta g, state)``.

        Raises:
            ValueError: ``direction`` does not match ``params`` (:meth:`check_step`).
        """
        self.check_step(params, direction, state)
        return {k: v - self.lr * direction[k] for k, v in params.items()}, state


class ServerMomentum(ServerOptimizer):
    """Heavy-ball server momentum (FedAvgM, Hsu et al., 2019): ``v <- beta v + g``, ``theta <- theta - eta v``.

    The velocity starts at zero, so ``v_1 = g``.

    Args:
        lr: eta_s.
        momentum: beta in [0, 1) (0.9 by default).
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.9):
        """Check the arguments (see the class docstring) and keep them."""
        self.momentum = check_range(momentum, "momentum", 0, 1, high_open=True)
        super().__init__(lr)

    def init_state(self, params: Params) -> dict:
        """``{"velocity": zeros like params}``.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            ``{"velocity": {name: zeros shaped like params[name]}}``.
        """
        return {"velocity": {k: torch.zeros_like(v) for k, v in params.items()}}

    def step(self, params: Params, direction: Params, state: dict) -> tuple[Params, dict]:
        """``v <- beta v + g``; ``theta - eta v``.

        Args:
            params: theta_t, ``{name: Tensor[...]}``.
            direction: ``g``, shaped like ``params``.
            state: ``{"velocity": {name: Tensor[...]}}`` (not modified).

        Returns:
            ``(theta_t - eta v, {"velocity": v})`` with the new velocity ``v``.

        Raises:
            ValueError: ``direction`` or the velocity does not match ``params`` (:meth:`check_step`).
        """
        self.check_step(params, direction, state)
        velocity = {k: self.momentum * state["velocity"][k] + g for k, g in direction.items()}
        return {k: v - self.lr * velocity[k] for k, v in params.items()}, {"velocity": velocity}


class _FedOpt(ServerOptimizer):
    """Adaptive server optimizers of Reddi et al. (2021): shared first moment and step."""

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        self.beta1 = check_range(beta1, "beta1", 0, 1, high_open=True)
        self.beta2 = check_range(beta2, "beta2", 0, 1, high_open=True)
        self.tau = check_positive(tau, "tau")
        super().__init__(lr)

    def _second_moment(self, v: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init_state(self, params: Params) -> dict:
        """``{"m": zeros, "v": tau^2}``, each shaped like ``params``.

        Raises:
            ValueError: ``tau**2`` underflows in the parameters' dtype (``tau`` is the step's
                floor: a zero coordinate of the direction would then give 0 / 0) or overflows.
        """
        square = self.tau**2 if self.tau < 1e150 else math.inf  # ** raises OverflowError past the float range
        for p in params.values():
            if not p.is_floating_point():
                continue
            info = torch.finfo(p.dtype)
            if square < info.tiny:
                raise ValueError(
                    f"tau={self.tau!r} is too small for {p.dtype} parameters: tau**2 (the second moment's start) "
                    "underflows to 0 and a zero coordinate of the direction would step by 0/0; use tau >= "
                    f"{math.sqrt(info.tiny):.3g}."
                )
            if square > info.max:
                raise ValueError(
                    f"tau={self.tau!r} is too large for {p.dtype} parameters: tau**2 (the second moment's start) "
                    f"overflows; use tau <= {math.sqrt(info.max):.3g} (the usual values are 1e-3 to 1e-1)."
                )
        return {
            "m": {k: torch.zeros_like(p) for k, p in params.items()},
            "v": {k: torch.full_like(p, square) for k, p in params.items()},
        }

    def step(self, params: Params, direction: Params, state: dict) -> tuple[Params, dict]:
        """``m <- b1 m + (1-b1) g``, the second moment, then ``theta - eta m / (sqrt(v) + tau)``.

        Raises:
            ValueError: ``direction`` or a moment does not match ``params`` (:meth:`check_step`).
        """
        self.check_step(params, direction, state)
        m = {k: self.beta1 * state["m"][k] + (1 - self.beta1) * g for k, g in direction.items()}
        v = {k: self._second_moment(state["v"][k], g * g) for k, g in direction.items()}
        return {k: p - self.lr * m[k] / (v[k].sqrt() + self.tau) for k, p in params.items()}, {"m": m, "v": v}


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

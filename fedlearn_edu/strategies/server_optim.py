"""Server optimizers: how the server turns a round's direction into new global parameters.

Sign convention (the whole package): a strategy's *direction* ``g`` is a
pseudo-gradient, pointing uphill like a loss gradient. For the FedAvg family
``g = -sum_i p_i Delta_i`` with ``Delta_i = theta_i - theta_t``. A server
optimizer steps *against* it; plain SGD gives ``theta_{t+1} = theta_t - eta_s g``,
which for FedAvg is ``theta_t + eta_s sum_i p_i Delta_i``.

A server step is a pure transform in the style of Optax: ``init(params) -> state`` and
``update(direction, state, params) -> (updates, new state)``, and the step is
``theta <- theta + updates``. Small transforms compose with :class:`chain`:

=====================================  ============================================================
:class:`scale` ``(factor)``            ``u = factor g``
:class:`sgd` ``(lr)``                  ``u = -eta g``
:class:`momentum` ``(beta)``           ``v <- beta v + g`` (``v_1 = g``); ``u = v``
:class:`clip_by_global_norm` ``(C)``   ``u = g min(1, C / ||g||)``, one L2 norm over every tensor
:class:`scale_by_adagrad`              ``m <- b1 m + (1-b1) g``; ``v <- v + g^2``; ``u = m / (sqrt(v) + tau)``
:class:`scale_by_adam`                 as Adagrad with ``v <- b2 v + (1-b2) g^2``
:class:`scale_by_yogi`                 as Adagrad with ``v <- v - (1-b2) g^2 sign(v - g^2)``
:class:`chain` ``(*transforms)``       each transform's ``u`` is the next one's direction
=====================================  ============================================================

The named optimizers are chains of them, bitwise the same as the update rules they name:

=========================  ==================================================================
:class:`ServerSGD`         ``chain(sgd(eta))``: ``theta <- theta - eta g``
:class:`ServerMomentum`    ``chain(momentum(beta), sgd(eta))``: ``theta <- theta - eta v`` (FedAvgM)
:class:`ServerAdagrad`     ``chain(scale_by_adagrad(b1, b2, tau, lr=eta))``
:class:`ServerAdam`        ``chain(scale_by_adam(b1, b2, tau, lr=eta))``
:class:`ServerYogi`        ``chain(scale_by_yogi(b1, b2, tau, lr=eta))``
=========================  ==================================================================

The last three are FedOpt (Reddi et al., 2021, Algorithm 2): ``m_0 = 0``,
``v_0 = tau^2`` and ``theta <- theta - eta m / (sqrt(v) + tau)``, without bias
correction, as in the paper. A FedOpt scaler given ``lr=eta`` takes that whole step,
rounded in the paper's order ``(eta m) / (sqrt(v) + tau)``; ``chain(scale_by_adam(),
sgd(eta))`` is the same step up to one rounding.

Composition is one line: FedAvg with the round's direction clipped to norm ``C`` on the
server is ``FedAvg(optimizer=chain(clip_by_global_norm(C), sgd(1.0)))``; clipped FedAdam
is ``chain(clip_by_global_norm(C), scale_by_adam(lr=0.01))``. The order matters:
``chain(clip_by_global_norm(C), sgd(eta))`` bounds the step by ``eta C``,
``chain(sgd(eta), clip_by_global_norm(C))`` by ``C``.

A transform is pure: it holds only its hyper-parameters. Its state (momentum, moments)
is created by ``init`` (:meth:`ServerOptimizer.init_state`) and passed in and returned
by ``update`` and :meth:`ServerOptimizer.step`; the strategy keeps it in the server
state (``server_state["optimizer"]``), which the driver checkpoints. A chain's state is
one dict holding each piece's entries (``{"velocity": ...}``, ``{"m": ..., "v": ...}``),
so a piece keeps a name no other piece of the chain keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..checks import check_float, check_positive, check_range
from ..params import Params

__all__ = [
    "ServerOptimizer",
    "ServerSGD",
    "ServerMomentum",
    "ServerAdagrad",
    "ServerAdam",
    "ServerYogi",
    "chain",
    "scale",
    "sgd",
    "momentum",
    "clip_by_global_norm",
    "scale_by_adagrad",
    "scale_by_adam",
    "scale_by_yogi",
]


class ServerOptimizer:
    """Base class of every server step: a pure transform of the direction, no state on ``self``.

    A subclass defines :meth:`init` (its state before round 1; ``{}`` by default) and
    :meth:`update` (the direction turned into an update); :meth:`step` adds the update to
    the parameters. Every transform, a :class:`chain` of them included, is a
    ``ServerOptimizer``, so any of them is a strategy's ``optimizer=``.

    Attributes:
        lr: the step size eta_s along ``-g`` that :attr:`Strategy.server_lr
            <fedlearn_edu.strategies.base.Strategy.server_lr>` reports (a chain's is the
            product of its pieces'), ``None`` for a piece that only reshapes the direction.

    Args:
        lr: the server step size eta_s (> 0), for subclasses that keep one.
    """

    lr: float | None = None

    def __init__(self, lr: float = 1.0):
        """Check the arguments (see the class docstring) and keep them."""
        self.lr = check_positive(lr, "lr")

    def init(self, params: Params) -> dict:
        """The transform's state before round 1.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}`` (one model, or K
                stacked ones ``Tensor[K, ...]``).

        Returns:
            ``{name: {param name: Tensor[...]}}`` shaped like ``params`` (``{}`` for a
            stateless transform).
        """
        return {}

    def init_state(self, params: Params) -> dict:
        """:meth:`init`, under the name the strategies call.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            The state of :meth:`init`.
        """
        return self.init(params)

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """The direction turned into an update; pure.

        Args:
            direction: ``g``, ``{name: Tensor[...]}`` shaped like ``params`` (in a chain: the
                previous piece's update).
            state: the transform's state (:meth:`init`, or the previous update's); not modified.
            params: theta_t, ``{name: Tensor[...]}`` (for transforms that depend on it).

        Returns:
            ``(updates, new state)``: ``updates`` shaped like ``direction``, to be added to theta_t.
        """
        raise NotImplementedError(f"{type(self).__name__} must define update(direction, state, params).")

    def step(self, params: Params, direction: Params, state: dict) -> tuple[Params, dict]:
        """One server step: ``theta_t + updates`` with ``updates, state = update(direction, state, params)``.

        Args:
            params: theta_t, ``{name: Tensor[...]}``.
            direction: the pseudo-gradient ``g``, shaped like ``params``.
            state: the optimizer's state (:meth:`init_state`, or the previous step's); not modified.

        Returns:
            ``(theta_{t+1}, new state)``.

        Raises:
            ValueError: ``direction`` (or a moment of ``state``) lacks a parameter of ``params``,
                has another one, or one of another shape (:meth:`check_step`).
        """
        self.check_step(params, direction, state)
        updates, state = self.update(direction, state, params)
        return {k: p + updates[k] for k, p in params.items()}, state

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

    def pieces(self) -> tuple[ServerOptimizer, ...]:
        """The transforms it is made of, in order (itself, for one piece; :class:`chain` flattens).

        Returns:
            ``(piece, ...)``: e.g. ``ServerMomentum(1.0, 0.9).pieces()`` is
            ``(momentum(beta=0.9), sgd(lr=1.0))``.
        """
        return (self,)

    def __repr__(self) -> str:
        """``Name(hyper-parameter=value, ...)``."""
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


# ---------------------------------------------------------------------------------------------
# The pieces (lower-case, as Optax names them: a chain reads as a formula)
# ---------------------------------------------------------------------------------------------


class scale(ServerOptimizer):
    """``u = factor g``; stateless. As an optimizer ``theta + factor g``, so its ``lr`` is ``-factor``.

    Args:
        factor: any finite real number (``scale(-eta)`` is :class:`sgd`'s step).

    Example:
        >>> scale(0.5).update({"w": torch.tensor([2.0, -4.0])}, {}, {})
        ({'w': tensor([ 1., -2.])}, {})
    """

    def __init__(self, factor: float):
        """Check the arguments (see the class docstring) and keep them."""
        self.factor = check_float(factor, "factor")

    @property
    def lr(self) -> float:
        """``-factor``: the step size along ``-g``."""
        return -self.factor

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """``factor g``.

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: ``{}``.
            params: unused.

        Returns:
            ``({name: factor g[name]}, {})``.
        """
        return {k: self.factor * g for k, g in direction.items()}, {}


class sgd(ServerOptimizer):
    """``u = -eta g``: gradient descent with step size eta; stateless.

    Args:
        lr: eta (> 0).

    Example:
        >>> sgd(0.5).step({"w": torch.ones(2)}, {"w": torch.tensor([2.0, -2.0])}, {})
        ({'w': tensor([0., 2.])}, {})
    """

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """``-(eta g)`` (``theta + (-(eta g))`` is ``theta - eta g`` bit for bit).

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: ``{}``.
            params: unused.

        Returns:
            ``({name: -(eta g[name])}, {})``.
        """
        return {k: -(self.lr * g) for k, g in direction.items()}, {}


class momentum(ServerOptimizer):
    """Heavy-ball momentum: ``v <- beta v + g``, ``u = v``; the velocity starts at zero, so ``v_1 = g``.

    Args:
        beta: the decay, in [0, 1) (``beta = 0`` passes ``g`` through unchanged).

    Example:
        >>> m = momentum(0.5)
        >>> u, state = m.update({"w": torch.tensor([2.0])}, m.init({"w": torch.zeros(1)}), {})
        >>> m.update({"w": torch.tensor([2.0])}, state, {})[0]
        {'w': tensor([3.])}
    """

    def __init__(self, beta: float = 0.9):
        """Check the arguments (see the class docstring) and keep them."""
        self.beta = check_range(beta, "beta", 0, 1, high_open=True)

    def init(self, params: Params) -> dict:
        """``{"velocity": zeros like params}``.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            ``{"velocity": {name: zeros shaped like params[name]}}``.
        """
        return {"velocity": {k: torch.zeros_like(v) for k, v in params.items()}}

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """``v <- beta v + g``; the update is ``v``.

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: ``{"velocity": {name: Tensor[...]}}`` (not modified).
            params: unused.

        Returns:
            ``(v, {"velocity": v})`` with the new velocity ``v``.
        """
        velocity = {k: self.beta * state["velocity"][k] + g for k, g in direction.items()}
        return dict(velocity), {"velocity": velocity}


class clip_by_global_norm(ServerOptimizer):
    """``u = g min(1, C / ||g||)``: the direction scaled down to L2 norm at most C; stateless.

    ``||g||`` is one norm over every tensor of the direction (all layers; with stacked
    parameters ``Tensor[K, ...]``, all K models together). The direction keeps its
    orientation; a direction of norm <= C, or zero, passes unchanged.

    Args:
        max_norm: C (> 0).

    Example:
        >>> clip_by_global_norm(1.0).update({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}, {}, {})[0]
        {'a': tensor([0.6000]), 'b': tensor([0.8000])}
    """

    def __init__(self, max_norm: float):
        """Check the arguments (see the class docstring) and keep them."""
        self.max_norm = check_positive(max_norm, "max_norm")

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """``g min(1, C / ||g||)``.

        Args:
            direction: ``g``, ``{name: Tensor[...]}`` (on one device, in one floating dtype).
            state: ``{}``.
            params: unused.

        Returns:
            ``({name: g[name] min(1, C / ||g||)}, {})``.
        """
        if not direction:
            return {}, {}
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in direction.values()]))
        factor = torch.clamp(self.max_norm / norm, max=1.0)  # C / 0 = inf: a zero direction stays zero
        return {k: g * factor for k, g in direction.items()}, {}


class _scale_by_fedopt(ServerOptimizer):
    """FedOpt's scalers (Reddi et al., 2021): ``m <- b1 m + (1-b1) g``, a second moment ``v``, ``m / (sqrt(v) + tau)``.

    Args:
        beta1: the first moment's decay b1, in [0, 1).
        beta2: the second moment's decay b2, in [0, 1) (Adagrad's ignores it).
        tau: the adaptivity floor (> 0); ``v_0 = tau^2``.
        lr: ``None``: the update is ``m / (sqrt(v) + tau)`` (chain it with :class:`sgd`);
            eta (> 0): the whole FedOpt step ``-(eta m) / (sqrt(v) + tau)``, rounded in the
            paper's order (what :class:`ServerAdam` and its siblings are).
    """

    def __init__(self, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3, lr: float | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        self.beta1 = check_range(beta1, "beta1", 0, 1, high_open=True)
        self.beta2 = check_range(beta2, "beta2", 0, 1, high_open=True)
        self.tau = check_positive(tau, "tau")
        self.lr = None if lr is None else check_positive(lr, "lr")

    def _second_moment(self, v: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init(self, params: Params) -> dict:
        """``{"m": zeros, "v": tau^2}``, each shaped like ``params``.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            ``{"m": {name: zeros}, "v": {name: tau^2}}``.

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

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """``m <- b1 m + (1-b1) g``, the second moment, then ``m / (sqrt(v) + tau)`` (or the step).

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: ``{"m": {name: Tensor[...]}, "v": {name: Tensor[...]}}`` (not modified).
            params: unused.

        Returns:
            ``(m / (sqrt(v) + tau), {"m": m, "v": v})``; with ``lr``: ``-(eta m) / (sqrt(v) + tau)``.
        """
        m = {k: self.beta1 * state["m"][k] + (1 - self.beta1) * g for k, g in direction.items()}
        v = {k: self._second_moment(state["v"][k], g * g) for k, g in direction.items()}
        if self.lr is None:
            updates = {k: m[k] / (v[k].sqrt() + self.tau) for k in m}
        else:
            updates = {k: -(self.lr * m[k] / (v[k].sqrt() + self.tau)) for k in m}
        return updates, {"m": m, "v": v}


class scale_by_adagrad(_scale_by_fedopt):
    """FedAdagrad's scaler: ``v <- v + g^2`` (``beta2`` unused); see :class:`scale_by_adam` for the arguments."""

    def _second_moment(self, v, g2):
        return v + g2


class scale_by_adam(_scale_by_fedopt):
    """FedAdam's scaler: ``v <- beta2 v + (1 - beta2) g^2``, ``u = m / (sqrt(v) + tau)`` (no bias correction).

    Args:
        beta1: the first moment's decay b1, in [0, 1).
        beta2: the second moment's decay b2, in [0, 1).
        tau: the adaptivity floor (> 0); ``v_0 = tau^2``.
        lr: ``None``: the update is ``m / (sqrt(v) + tau)`` (chain it with :class:`sgd`);
            eta (> 0): the whole FedOpt step ``-(eta m) / (sqrt(v) + tau)``.
    """

    def _second_moment(self, v, g2):
        return self.beta2 * v + (1 - self.beta2) * g2


class scale_by_yogi(_scale_by_fedopt):
    """FedYogi's scaler: ``v <- v - (1 - beta2) g^2 sign(v - g^2)``; see :class:`scale_by_adam` for the arguments."""

    def _second_moment(self, v, g2):
        return v - (1 - self.beta2) * g2 * torch.sign(v - g2)


class chain(ServerOptimizer):
    """Transforms applied in order: each one's update is the next one's direction.

    The state is one dict holding every piece's entries (a piece sees only its own), so
    two pieces may not keep an entry of the same name (two momenta, two FedOpt scalers).

    Args:
        *transforms: the pieces (:class:`scale`, :class:`sgd`, :class:`momentum`,
            :class:`clip_by_global_norm`, the FedOpt scalers, a named optimizer, another
            chain, or your own :class:`ServerOptimizer`).

    Raises:
        TypeError: a piece is not a :class:`ServerOptimizer` (e.g. the class ``sgd`` instead
            of ``sgd(1.0)``).
        ValueError: two pieces keep a state entry of the same name.

    Example:
        >>> clipped = chain(clip_by_global_norm(1.0), sgd(0.5))
        >>> clipped.step({"w": torch.zeros(2)}, {"w": torch.tensor([3.0, 4.0])}, clipped.init_state({}))
        ({'w': tensor([-0.3000, -0.4000])}, {})
    """

    def __init__(self, *transforms: ServerOptimizer):
        """Check the arguments (see the class docstring) and keep them."""
        for i, t in enumerate(transforms):
            if not isinstance(t, ServerOptimizer):
                raise TypeError(
                    f"chain's transform {i} must be a server transform (e.g. clip_by_global_norm(1.0), sgd(1.0), "
                    f"ServerAdam()), got {t!r} ({type(t).__name__})."
                )
        keys, owner = [], {}
        for t in transforms:
            keys.append(tuple(t.init_state({})))
            for k in keys[-1]:
                if k in owner:
                    raise ValueError(
                        f"chain: {owner[k]!r} and {t!r} both keep the state entry {k!r}; a chain's state is one "
                        "dict of its pieces' entries, so chain at most one piece that keeps it."
                    )
                owner[k] = t
        self.transforms = tuple(transforms)
        self._keys = tuple(keys)

    @property
    def lr(self) -> float | None:
        """The chain's step size along ``-g`` (``None`` if no piece has one).

        A piece with step size ``r`` multiplies by ``-r``, so the chain multiplies ``g`` by
        ``prod(-r)`` and steps ``-prod(-r)`` along ``-g``: ``chain(scale(2.0), sgd(0.5))``
        steps 1.0; ``chain(scale(0.5))`` steps -0.5 (uphill).
        """
        rates = [t.lr for t in self.transforms if t.lr is not None]
        return -math.prod(-r for r in rates) if rates else None

    def init(self, params: Params) -> dict:
        """Every piece's state, in one dict.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            ``{entry: {name: Tensor[...]}}``: the union of the pieces' states.
        """
        return {k: v for t in self.transforms for k, v in t.init_state(params).items()}

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """Each piece's update of the previous piece's, in order.

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: the chain's state (:meth:`init`, or the previous update's); not modified.
            params: theta_t, passed to every piece.

        Returns:
            ``(the last piece's update, the pieces' new states in one dict)``.

        Raises:
            ValueError: ``state`` lacks an entry a piece keeps.
        """
        new_state = {}
        for t, keys in zip(self.transforms, self._keys):
            missing = [k for k in keys if k not in state]
            if missing:
                raise ValueError(f"chain.update: state lacks {missing} (from init(params)); it has {sorted(state)}.")
            direction, own = t.update(direction, {k: state[k] for k in keys}, params)
            new_state.update(own)
        return direction, new_state

    def pieces(self) -> tuple[ServerOptimizer, ...]:
        """Every piece of the chain, nested chains and named optimizers flattened, in order."""
        return tuple(p for t in self.transforms for p in t.pieces())

    def __repr__(self) -> str:
        """``chain(piece, ...)``."""
        return f"chain({', '.join(map(repr, self.transforms))})"


# ---------------------------------------------------------------------------------------------
# The named optimizers: names for chains
# ---------------------------------------------------------------------------------------------


class _Named(ServerOptimizer):
    """An optimizer that is a name for a chain (:meth:`as_chain`), built from its hyper-parameters."""

    def as_chain(self) -> chain:
        """The chain this optimizer names."""
        raise NotImplementedError

    def pieces(self) -> tuple[ServerOptimizer, ...]:
        """The pieces of the chain it names."""
        return self.as_chain().pieces()

    def init(self, params: Params) -> dict:
        """The chain's state (see :meth:`chain.init`).

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            ``{entry: {name: Tensor[...]}}``.
        """
        return self.as_chain().init(params)

    def update(self, direction: Params, state: dict, params: Params) -> tuple[Params, dict]:
        """The chain's update (see :meth:`chain.update`).

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: the optimizer's state (not modified).
            params: theta_t.

        Returns:
            ``(updates, new state)``.
        """
        return self.as_chain().update(direction, state, params)


class ServerSGD(_Named):
    """``theta <- theta - eta g``: ``chain(sgd(eta))``.

    Args:
        lr: eta (> 0).

    Example:
        >>> ServerSGD(0.5).step({"w": torch.ones(2)}, {"w": torch.tensor([2.0, -2.0])}, {})
        ({'w': tensor([0., 2.])}, {})
    """

    def as_chain(self) -> chain:
        """``chain(sgd(lr))``."""
        return chain(sgd(self.lr))


class ServerMomentum(_Named):
    """Heavy-ball server momentum (FedAvgM, Hsu et al., 2019): ``v <- beta v + g``, ``theta <- theta - eta v``.

    ``chain(momentum(beta), sgd(eta))``. The velocity starts at zero, so ``v_1 = g``.

    Args:
        lr: eta_s.
        momentum: beta in [0, 1) (0.9 by default).
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.9):
        """Check the arguments (see the class docstring) and keep them."""
        self.momentum = check_range(momentum, "momentum", 0, 1, high_open=True)
        super().__init__(lr)

    def as_chain(self) -> chain:
        """``chain(momentum(momentum), sgd(lr))``."""
        return chain(momentum(self.momentum), sgd(self.lr))


class _FedOpt(_Named):
    """Adaptive server optimizers of Reddi et al. (2021): ``chain(scaler(b1, b2, tau, lr=eta))``."""

    _scaler: type[_scale_by_fedopt]

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        self.beta1 = check_range(beta1, "beta1", 0, 1, high_open=True)
        self.beta2 = check_range(beta2, "beta2", 0, 1, high_open=True)
        self.tau = check_positive(tau, "tau")
        super().__init__(lr)

    def as_chain(self) -> chain:
        """``chain(scale_by_...(beta1, beta2, tau, lr=lr))``."""
        return chain(self._scaler(self.beta1, self.beta2, self.tau, lr=self.lr))


class ServerAdagrad(_FedOpt):
    """FedAdagrad's server step: ``v <- v + g^2`` (``beta2`` unused); ``chain(scale_by_adagrad(..., lr=eta))``."""

    _scaler = scale_by_adagrad


class ServerAdam(_FedOpt):
    """FedAdam's server step: ``v <- beta2 v + (1 - beta2) g^2``; ``chain(scale_by_adam(..., lr=eta))``."""

    _scaler = scale_by_adam


class ServerYogi(_FedOpt):
    """FedYogi's server step: ``v <- v - (1 - beta2) g^2 sign(v - g^2)``; ``chain(scale_by_yogi(..., lr=eta))``."""

    _scaler = scale_by_yogi

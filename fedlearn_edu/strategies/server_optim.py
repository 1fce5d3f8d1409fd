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

One name per optimizer: the lower-case transform is the canonical one (it holds the math);
the ``Server*`` names are documented aliases, thin subclasses that only put the step size first
(``ServerAdam(eta)``), bitwise the same steps and states (tested), and the strategies ``FedAvgM``,
``FedAdam``, ``FedYogi`` and ``FedAdagrad`` are FedAvg's direction under them:

=========================  =============================================  =====================
alias                      canonical                                      strategy
=========================  =============================================  =====================
:class:`ServerSGD`         ``sgd(eta)``: ``theta <- theta - eta g``       ``FedAvg``
:class:`ServerMomentum`    ``chain(momentum(beta), sgd(eta))``            ``FedAvgM``
:class:`ServerAdagrad`     ``scale_by_adagrad(b1, b2, tau, lr=eta)``      ``FedAdagrad``
:class:`ServerAdam`        ``scale_by_adam(b1, b2, tau, lr=eta)``         ``FedAdam``
:class:`ServerYogi`        ``scale_by_yogi(b1, b2, tau, lr=eta)``         ``FedYogi``
=========================  =============================================  =====================

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
state (``server_state["optimizer"]``), which the driver checkpoints. A piece's state is a
dict (``{}``, ``{"velocity": ...}``, ``{"m": ..., "v": ...}``); a chain's is the tuple of
its pieces' states, one per piece in order (as Optax's), so any pieces compose:
``chain(momentum(0.9), momentum(0.5), sgd(1.0))`` keeps two velocities,
``({"velocity": ...}, {"velocity": ...}, {})``.
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
        self._check_tree(type(self).__name__, "direction", direction, expected)
        self.check_state(expected, state, type(self).__name__, "state")

    def check_state(self, expected: dict, state, owner: str, where: str) -> None:
        """Refuse a state that lacks one of the moments :meth:`init_state` makes, or whose moment does not match.

        Args:
            expected: ``{name: shape}`` of the parameters.
            state: this transform's state (a dict of moments; a chain's: a tuple of its pieces').
            owner: the optimizer whose ``step`` checks (for the message).
            where: the state's label in the message (``"state"``, ``"state[1]"``).

        Raises:
            ValueError: a moment missing, a name missing or unexpected, or a shape that differs.
        """
        moments = self.init_state({})
        if moments and not isinstance(state, Mapping):
            raise ValueError(
                f"{owner}.step needs {where} to be {type(self).__name__}'s state, a dict of {sorted(moments)} "
                f"(from init_state(params)); got a {type(state).__name__}."
            )
        for moment in moments:
            if not isinstance(state.get(moment), Mapping):
                raise ValueError(
                    f"{owner}.step needs {where}[{moment!r}] (from init_state(params)); the state has {sorted(state)}."
                )
            self._check_tree(owner, f"{where}[{moment!r}]", state[moment], expected)

    @staticmethod
    def _check_tree(owner: str, what: str, tree: Mapping, expected: dict) -> None:
        """Refuse ``tree`` unless it has exactly the names and shapes of ``expected``."""
        missing, unknown = sorted(set(expected) - set(tree)), sorted(set(tree) - set(expected))
        if missing or unknown:
            raise ValueError(
                f"{owner}.step: {what} must have the names of params {sorted(expected)}; "
                f"missing {missing[:5]}, unexpected {unknown[:5]}."
            )
        for k, shape in expected.items():
            if tuple(tree[k].shape) != shape:
                raise ValueError(
                    f"{owner}.step: {what}[{k!r}] has shape {tuple(tree[k].shape)}, params[{k!r}] has {shape}."
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

    The state is the tuple of the pieces' states, one per piece in order (Optax's layout): each
    piece sees only its own, so any pieces compose, two momenta or two FedOpt scalers included.

    Args:
        *transforms: the pieces (:class:`scale`, :class:`sgd`, :class:`momentum`,
            :class:`clip_by_global_norm`, the FedOpt scalers, a named optimizer, another
            chain, or your own :class:`ServerOptimizer`).

    Raises:
        TypeError: a piece is not a :class:`ServerOptimizer` (e.g. the class ``sgd`` instead
            of ``sgd(1.0)``).

    Example:
        >>> clipped = chain(clip_by_global_norm(1.0), sgd(0.5))
        >>> clipped.step({"w": torch.zeros(2)}, {"w": torch.tensor([3.0, 4.0])}, clipped.init_state({}))
        ({'w': tensor([-0.3000, -0.4000])}, ({}, {}))
    """

    def __init__(self, *transforms: ServerOptimizer):
        """Check the arguments (see the class docstring) and keep them."""
        for i, t in enumerate(transforms):
            if not isinstance(t, ServerOptimizer):
                raise TypeError(
                    f"chain's transform {i} must be a server transform (e.g. clip_by_global_norm(1.0), sgd(1.0), "
                    f"ServerAdam()), got {t!r} ({type(t).__name__})."
                )
        self.transforms = tuple(transforms)

    @property
    def lr(self) -> float | None:
        """The chain's step size along ``-g`` (``None`` if no piece has one).

        A piece with step size ``r`` multiplies by ``-r``, so the chain multiplies ``g`` by
        ``prod(-r)`` and steps ``-prod(-r)`` along ``-g``: ``chain(scale(2.0), sgd(0.5))``
        steps 1.0; ``chain(scale(0.5))`` steps -0.5 (uphill).
        """
        rates = [t.lr for t in self.transforms if t.lr is not None]
        return -math.prod(-r for r in rates) if rates else None

    def init(self, params: Params) -> tuple:
        """Every piece's state, one per piece.

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            ``(state of piece 0, state of piece 1, ...)``: each ``{entry: {name: Tensor[...]}}``
            (``{}`` for a stateless piece; a nested chain's is a tuple again).
        """
        return tuple(t.init_state(params) for t in self.transforms)

    def _check_pieces(self, state, owner: str, where: str) -> None:
        """Refuse a state that is not a tuple of one state per piece."""
        if not isinstance(state, (tuple, list)) or len(state) != len(self.transforms):
            got = f"a {type(state).__name__} of {len(state)}" if isinstance(state, (tuple, list)) else repr(state)
            got = got if len(got) <= 80 else f"a {type(state).__name__}"
            raise ValueError(
                f"{owner}: {where} must be the chain's state, a tuple of its {len(self.transforms)} pieces' states "
                f"in order (from init_state(params)); got {got}."
            )

    def check_state(self, expected: dict, state, owner: str, where: str) -> None:
        """Refuse a state that is not one matching state per piece (see :meth:`ServerOptimizer.check_state`).

        Args:
            expected: ``{name: shape}`` of the parameters.
            state: the chain's state, one state per piece.
            owner: the optimizer whose ``step`` checks (for the message).
            where: the state's label in the message.

        Raises:
            ValueError: not a tuple of one state per piece, or a piece's state that does not match.
        """
        self._check_pieces(state, f"{owner}.step", where)
        for i, (t, own) in enumerate(zip(self.transforms, state)):
            t.check_state(expected, own, owner, f"{where}[{i}]")

    def update(self, direction: Params, state: tuple, params: Params) -> tuple[Params, tuple]:
        """Each piece's update of the previous piece's, in order, each on its own state.

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: the chain's state (:meth:`init`, or the previous update's): one state per
                piece, in order; not modified.
            params: theta_t, passed to every piece.

        Returns:
            ``(the last piece's update, the pieces' new states, one per piece)``.

        Raises:
            ValueError: ``state`` is not a tuple of one state per piece.
        """
        self._check_pieces(state, "chain.update", "state")
        new_state = []
        for t, own in zip(self.transforms, state):
            direction, own = t.update(direction, own, params)
            new_state.append(own)
        return direction, tuple(new_state)

    def pieces(self) -> tuple[ServerOptimizer, ...]:
        """Every piece of the chain, nested chains and named optimizers flattened, in order."""
        return tuple(p for t in self.transforms for p in t.pieces())

    def __repr__(self) -> str:
        """``chain(piece, ...)``."""
        return f"chain({', '.join(map(repr, self.transforms))})"


# ---------------------------------------------------------------------------------------------
# The named optimizers: documented aliases of the canonical transforms (one name per optimizer)
# ---------------------------------------------------------------------------------------------


class _Named(ServerOptimizer):
    """A name for a chain (:meth:`as_chain`), built from its hyper-parameters; its state is the chain's."""

    def as_chain(self) -> chain:
        """The chain this optimizer names."""
        raise NotImplementedError

    def pieces(self) -> tuple[ServerOptimizer, ...]:
        """The pieces of the chain it names."""
        return self.as_chain().pieces()

    def init(self, params: Params) -> tuple:
        """The chain's state (see :meth:`chain.init`).

        Args:
            params: the parameters it will step, ``{name: Tensor[...]}``.

        Returns:
            One state per piece of the chain.
        """
        return self.as_chain().init(params)

    def check_state(self, expected: dict, state, owner: str, where: str) -> None:
        """The chain's check (see :meth:`chain.check_state`).

        Args:
            expected: ``{name: shape}`` of the parameters.
            state: the chain's state, one state per piece.
            owner: the optimizer whose ``step`` checks (for the message).
            where: the state's label in the message.
        """
        self.as_chain().check_state(expected, state, owner, where)

    def update(self, direction: Params, state: tuple, params: Params) -> tuple[Params, tuple]:
        """The chain's update (see :meth:`chain.update`).

        Args:
            direction: ``g``, ``{name: Tensor[...]}``.
            state: the optimizer's state (not modified).
            params: theta_t.

        Returns:
            ``(updates, new state)``.
        """
        return self.as_chain().update(direction, state, params)


class ServerSGD(sgd):
    """Alias of :class:`sgd`: ``theta <- theta - eta g`` (the same step and state, under the name FedAvg's repr shows).

    Args:
        lr: eta (> 0).

    Example:
        >>> ServerSGD(0.5).step({"w": torch.ones(2)}, {"w": torch.tensor([2.0, -2.0])}, {})
        ({'w': tensor([0., 2.])}, {})
    """


class ServerMomentum(_Named):
    """Heavy-ball server momentum (FedAvgM, Hsu et al., 2019): ``v <- beta v + g``, ``theta <- theta - eta v``.

    A name for ``chain(momentum(beta), sgd(eta))`` (:meth:`as_chain`): the same step and the
    chain's state, ``({"velocity": ...}, {})``. The velocity starts at zero, so ``v_1 = g``.

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


class _StepFirst:
    """The FedOpt aliases' constructor: the step size first, then the scaler's arguments."""

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(beta1, beta2, tau, lr=1.0)
        self.lr = check_positive(lr, "lr")  # a step is required (the scaler alone would take lr=None)


class ServerAdagrad(_StepFirst, scale_by_adagrad):
    """Alias of :class:`scale_by_adagrad` with its step first: FedAdagrad's server step, ``v <- v + g^2``.

    ``ServerAdagrad(lr, beta1, beta2, tau)`` is ``scale_by_adagrad(beta1, beta2, tau, lr=lr)``: a
    subclass that only orders the arguments (the same update and state ``{"m", "v"}``, bit for bit).

    Args:
        lr: eta (> 0; 0.01).
        beta1: the first moment's decay b1, in [0, 1).
        beta2: unused by Adagrad (checked like Adam's).
        tau: the adaptivity floor (> 0); ``v_0 = tau^2``.
    """


class ServerAdam(_StepFirst, scale_by_adam):
    """Alias of :class:`scale_by_adam` with its step first: FedAdam's server step, ``v <- b2 v + (1 - b2) g^2``.

    ``ServerAdam(lr, beta1, beta2, tau)`` is ``scale_by_adam(beta1, beta2, tau, lr=lr)``: a subclass
    that only orders the arguments (the same update and state ``{"m", "v"}``, bit for bit).

    Args:
        lr: eta (> 0; 0.01).
        beta1: the first moment's decay b1, in [0, 1).
        beta2: the second moment's decay b2, in [0, 1).
        tau: the adaptivity floor (> 0); ``v_0 = tau^2``.
    """


class ServerYogi(_StepFirst, scale_by_yogi):
    """Alias of :class:`scale_by_yogi` with its step first: FedYogi's step, ``v <- v - (1 - b2) g^2 sign(v - g^2)``.

    ``ServerYogi(lr, beta1, beta2, tau)`` is ``scale_by_yogi(beta1, beta2, tau, lr=lr)``: a subclass
    that only orders the arguments (the same update and state ``{"m", "v"}``, bit for bit).

    Args:
        lr: eta (> 0; 0.01).
        beta1: the first moment's decay b1, in [0, 1).
        beta2: the second moment's decay b2, in [0, 1).
        tau: the adaptivity floor (> 0); ``v_0 = tau^2``.
    """

"""The strategy protocol: what one method does each round, for :func:`~fedlearn_edu.simulate`.

The driver (:func:`fedlearn_edu.simulate`) owns sampling, seeds, devices, the
engine, NaN checks, evaluation, checkpoints and History. A strategy says what
happens in between, in the FedJAX style: explicit state in, new state out::

    server, clients = strategy.init_state(params0, model, N, seed)  # server state, client state
    # each round t, for the m selected clients:
    config = strategy.configure_local(config)                       # client hyper-parameters
    out = strategy.client_update(work, server, client_rows)         # ClientOutput (client side)
    server, diagnostics = strategy.aggregate(server, updates)       # server side, pure
    # every eval_every rounds:
    strategy.eval_models(model, server, clients, train_sets)        # which model each client uses

**Server state** is a typed, frozen record of tensors and plain values
(:mod:`fedlearn_edu.strategies.state`: a :class:`~fedlearn_edu.strategies.state.ServerState`
dataclass per kind of strategy, read like a dict of its fields) that the driver owns, moves to
the run's device and checkpoints (the strategy object holds only hyper-parameters):
the server's model (``"params"``: one model ``{name: Tensor}``; IFCA's ``"clusters"``,
``{name: Tensor[K, ...]}``; decentralised methods' ``"models"``, ``{name: Tensor[N, ...]}``;
nothing for local-only training; :meth:`Strategy.server_params` and
:meth:`Strategy.with_server_params` say where), the optimizer's moments (``"optimizer"``),
the strategy's own tensors (SCAFFOLD's ``"control"``, FedDyn's ``"h"``, CRAFT's
``"reference"``, ...) and, for a strategy built on a base strategy (a
:class:`~fedlearn_edu.strategies.wrapper.Wrapper`: Ditto, FedVG over X, a user's), the
base's server state under ``"base"``. A hook makes a new state with
:func:`~fedlearn_edu.strategies.state.updated` (a name the state does not declare is an
error). :meth:`Strategy.aggregate` and
:meth:`Strategy.direction` are pure functions of their inputs: called twice on the same
state and updates they give the same result and change nothing.

**Declared needs** (:class:`Needs`, ``Strategy.needs``): the client signals the server
step reads, whether the server needs a validation set, whether it keeps one model,
K cluster models or none, and what a strategy built on it must know (whether its server
step is private, whether its direction takes per-client weights, whether its clients keep
personal models). The driver, the Flower adapter and the wrappers read the declaration,
never a strategy's name.

**Client state** is a dict of tensors stacked on a leading client axis,
``{name: Tensor[N, ...]}``, created by :meth:`Strategy.init_state`. The driver
gives :meth:`Strategy.client_update` the rows of the selected clients only
(``Tensor[m, ...]``) and writes back the rows the update returns
(``ClientOutput.state``); it keeps the state on the run's device and in the
checkpoint.

**Local objective.** What a strategy changes on the client goes through the
engines' one hook (see :mod:`fedlearn_edu.engine`): client j minimises
``CE + (mu/2)||w - anchor||^2 + <c_j, w>`` from its starting point, with ``mu``
from :meth:`Strategy.configure_local` (``LocalTraining.prox_mu``), the anchor
(the round's global parameters by default), an optional per-client start
(``start``, ``Tensor[m, ...]``) and linear term (``linear``, ``Tensor[m, ...]``)
passed to :meth:`ClientWork.train`. Both engines honour it identically.

**Server direction.** :meth:`Strategy.direction` turns the round's updates into a
pseudo-gradient ``g`` (one sign convention for the package: ``g`` points uphill,
``g = -sum_i p_i Delta_i`` for FedAvg); the strategy's
:class:`~fedlearn_edu.strategies.server_optim.ServerOptimizer` applies it
(:meth:`Strategy.aggregate`: :meth:`Strategy.direction`, then :meth:`Strategy.apply`,
which checks ``g`` and calls :meth:`Strategy.step`): SGD ``theta - eta_s g``, heavy-ball
momentum, Adam/Yogi/Adagrad. What a strategy keeps of each new model (AFL's averaged
iterate) belongs in ``step``, which a wrapper's server step runs too. Any direction
composes with any optimizer. ``aggregate`` and
``direction`` are plain functions of tensors (server state in, server state out), so a
Flower server (or any other caller) can use them outside :func:`simulate`.

How the methods map onto the protocol:

===========  =====================================================================================
FedAvg       direction ``-sum p_i Delta_i``; SGD. FedAvgM: the same with ``ServerMomentum``;
             FedAdam/FedYogi: with ``ServerAdam``/``ServerYogi``. FedProx: ``configure_local``
             sets ``prox_mu``.
Wrapper      a strategy on top of a base strategy (:class:`~fedlearn_edu.strategies.wrapper.Wrapper`):
             every hook is the base's on the base's state (``"base"``); a subclass overrides only
             what it changes.
FedVG        a Wrapper whose direction is a weighting of the deltas, over any one-model base whose
             ``configure_local``/``client_update``, step and server state (``"base"``) it keeps,
             with any optimizer (alone: FedAvg's clients, a flat state).
Ditto        a Wrapper with client state ``personal`` (``Tensor[N, ...]``); ``client_update`` runs
             the base strategy's update and then the personal step (``start`` = personal rows,
             ``prox_mu`` = lambda, anchor = theta_t); server side of the base; evaluated on the
             personal models.
IFCA         the server keeps the K cluster models (``"clusters"``, ``Tensor[K, ...]``); ``client_update``
             picks each client's cluster and trains from it (``start``); the direction is the
             per-cluster average; evaluated on each client's best cluster; client state
             ``cluster`` (``Tensor[N]``, the last pick).
Local only   client state ``personal``; no server model, no server step.
SCAFFOLD     client state ``c_i`` and server state ``"control"`` (c); ``client_update`` trains with
             ``linear = c - c_i`` and returns the new ``c_i`` rows (option II:
             ``c_i - c + (theta_t - w_i) / (K lr)``, K = ``LocalResult.num_steps``) and
             ``signals["delta_c"]``; ``direction`` averages the deltas and updates ``c``.
FedDyn       client state ``grad_i`` (``Tensor[N, ...]``) and server state ``"h"``; ``configure_local``
             sets ``prox_mu = alpha``; ``client_update`` trains with ``linear = -grad_i`` and
             returns ``grad_i - alpha (w_i - theta_t)``; ``direction`` updates ``h`` and returns
             ``-(mean Delta) + h / alpha``.
FedNova      ``client_update`` adds ``signals["tau"] = LocalResult.num_steps``; ``direction`` is
             the normalised average ``-(sum p_i tau_i) sum p_i Delta_i / tau_i``.
===========  =====================================================================================
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..checks import check_positive, nonfinite_keys
from ..engine import LocalResult, LocalTraining
from ..params import Params
from ..utils import derive_seed
from .server_optim import ServerOptimizer, ServerSGD
from .state import ModelState, updated

__all__ = ["ClientUpdates", "ClientWork", "ClientOutput", "Needs", "Strategy", "SERVER_MODELS", "check_base"]

SERVER_MODELS = ("one", "clusters", "none")

# The protocol's hooks. A concrete strategy defines the required one (it is abstract: a class
# without it cannot be built); every optional one has a default that is FedAvg's behaviour.
REQUIRED_HOOKS = ("direction",)
OPTIONAL_HOOKS = (
    "init_state",
    "server_params",
    "with_server_params",
    "client_view",
    "configure_local",
    "client_signals",
    "client_update",
    "nonfinite_hint",
    "apply",
    "step",
    "init_optimizer_state",
    "aggregate",
    "eval_models",
    "min_clients_per_round",
)


@dataclass(frozen=True)
class Needs:
    """What a strategy needs from its callers (the driver and the Flower adapter read it).

    Attributes:
        signals: the keys of ``ClientUpdates.signals`` the server step reads (the clients'
            ``client_update`` must report them; e.g. ``{"oui"}`` for FedOUI).
        validation: the server step uses a validation set, ``strategy.validation_data``
            (``(x: Tensor[n, ...], y: Tensor[n])``), checked against the data up front.
        server_model: ``"one"`` (one global model, ``server_state["params"]``; conflicts are
            counted against its update), ``"clusters"`` (K models, IFCA) or ``"none"`` (no
            global model: local-only training, decentralised methods).
        sums_only: the server step needs only *sums* of vectors the clients compute (FedAvg's
            ``sum n_i Delta_i`` and ``sum n_i``, SCAFFOLD's sums of Delta_i and Delta c_i, ...), so it
            can run under secure aggregation (:mod:`fedlearn_edu.secagg`); ``False`` (the
            default, the safe side) when it reads each client's update or signal.
        private: the server step is differentially private, and its guarantee rests on weighing
            every client's clipped update alike (DP-FedAvg): a wrapper that re-weights the updates
            (FedVG) refuses it (:func:`check_base`).
        weighted_direction: :meth:`Strategy.direction` takes ``weights=`` (``Tensor[m]``) in place
            of its own weighting of the clients (SCAFFOLD, FedDyn): a re-weighting wrapper (FedVG)
            runs the base's server step with its weights.
        personal: the clients keep models of their own and are evaluated on them (Ditto,
            local-only and decentralised training): a wrapper that builds on the base's one global
            model refuses it (:func:`check_base`).
    """

    signals: frozenset = frozenset()
    validation: bool = False
    server_model: str = "one"
    sums_only: bool = False
    private: bool = False
    weighted_direction: bool = False
    personal: bool = False

    def __post_init__(self):
        """Check ``server_model`` and freeze ``signals``."""
        if self.server_model not in SERVER_MODELS:
            raise ValueError(f"server_model must be one of {SERVER_MODELS}, got {self.server_model!r}.")
        object.__setattr__(self, "signals", frozenset(self.signals))


def _rows(value, keep: Tensor, m: int):
    """``value`` restricted to the rows ``keep`` when it is a ``Tensor[m, ...]`` (else unchanged)."""
    if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == m:
        return value[keep.to(value.device)]
    if isinstance(value, dict):
        return {k: _rows(v, keep, m) for k, v in value.items()}
    return value


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
        config: the clients' local-training settings of this round (e.g. q-FedAvg reads ``lr``).
        checked: ``deltas`` were scanned for NaN/Inf by the round's bad-client policy
            (:func:`fedlearn_edu.round.bad_clients`: the driver and the Flower server set it), so
            the strategy passes ``check=not updates.checked`` to the aggregation functions it
            gives ``deltas`` and they skip their own scan. ``False`` (the default): they scan.
    """

    round: int
    client_ids: Tensor
    deltas: Params
    num_samples: Tensor
    train_loss: Tensor
    model: nn.Module
    signals: dict = field(default_factory=dict)
    config: LocalTraining | None = None
    checked: bool = False

    @property
    def num_clients(self) -> int:
        """m, the number of clients in the updates."""
        return int(self.client_ids.shape[0])

    @property
    def size_weights(self) -> Tensor:
        """``Tensor[m]``: p_i = n_i / sum_j n_j over the selected clients."""
        n = self.num_samples.to(torch.float64)
        return (n / n.sum()).to(next(iter(self.deltas.values())).dtype)

    def subset(self, keep: Tensor) -> ClientUpdates:
        """The updates of the clients where ``keep`` is true.

        Args:
            keep: ``Tensor[m]`` (bool).

        Returns:
            A new :class:`ClientUpdates` with the kept clients' rows.
        """
        m = self.num_clients
        return ClientUpdates(
            self.round,
            self.client_ids[keep.cpu()],
            _rows(self.deltas, keep, m),
            _rows(self.num_samples, keep, m),
            _rows(self.train_loss, keep, m),
            self.model,
            _rows(self.signals, keep, m),
            self.config,
            self.checked,
        )


@dataclass
class ClientWork:
    """The round's selected clients, as :meth:`Strategy.client_update` sees them.

    Attributes:
        round: t.
        client_ids: ``Tensor[m]`` (CPU, int64).
        datasets: per client ``(x: Tensor[n_i, ...], y: Tensor[n_i])`` on the run's device.
        seeds: per-client batch-order seeds ``derive_seed(seed, t, i)``.
        config: the local-training settings after :meth:`Strategy.configure_local`.
        model: the architecture (a private copy on the run's device).
        engine: the run's training engine (loop or vmap).
        seed: the run's seed (for further per-client streams, :meth:`derived_seeds`).
        all_num_samples: ``Tensor[N]`` training-set sizes of *all* N clients (decentralised
            methods weigh the neighbours' models they receive by them); ``None`` if unknown.
    """

    round: int
    client_ids: Tensor
    datasets: Sequence[tuple[Tensor, Tensor]]
    seeds: list
    config: LocalTraining
    model: nn.Module
    engine: object
    seed: int = 0
    all_num_samples: Tensor | None = None

    @classmethod
    def for_round(
        cls,
        round: int,
        client_ids: Tensor,
        train_sets: Sequence[tuple[Tensor, Tensor]],
        config: LocalTraining,
        model: nn.Module,
        engine: object,
        seed: int,
        all_num_samples: Tensor | None = None,
    ) -> ClientWork:
        """The round's work for the clients ``client_ids``, as the driver and a Flower node build it.

        Args:
            round: t (1-based).
            client_ids: ``Tensor[m]`` (int64) the selected clients, sorted.
            train_sets: the training sets of *all* clients, indexed by id (a Flower node
                passes ``{i: its own}``).
            config: the round's settings (after ``configure_local``).
            model: the architecture on the run's device.
            engine: the training engine.
            seed: the run's seed; client i's batch order is ``derive_seed(seed, t, i)``.
            all_num_samples: ``Tensor[N]`` training-set sizes of all clients, if known.

        Returns:
            The :class:`ClientWork`.
        """
        ids = client_ids.tolist()
        return cls(
            round=int(round),
            client_ids=client_ids,
            datasets=[train_sets[i] for i in ids],
            seeds=[derive_seed(seed, round, i) for i in ids],
            config=config,
            model=model,
            engine=engine,
            seed=int(seed),
            all_num_samples=all_num_samples,
        )

    def train(
        self,
        params: Params | None,
        *,
        start: Params | None = None,
        linear: Params | None = None,
        config: LocalTraining | None = None,
        seeds: Sequence[int] | None = None,
    ) -> LocalResult:
        """Local training of the selected clients through the engine (the local-objective hook).

        Args:
            params: theta_t ``{name: Tensor}``: the start (unless ``start``) and the anchor of
                the proximal term; ``None`` for clients without a global model (local-only,
                clustered, decentralised training), which then need ``start`` and no proximal term.
            start: stacked ``{name: Tensor[m, ...]}`` per-client starting points.
            linear: stacked ``{name: Tensor[m, ...]}`` per-client linear terms.
            config: settings (default: the round's ``config``).
            seeds: batch-order seeds (default: the round's ``seeds``).

        Returns:
            The engine's :class:`~fedlearn_edu.engine.LocalResult` (``params`` ``Tensor[m, ...]``).

        Raises:
            ValueError: ``params`` is ``None`` without ``start``, or with a proximal term.
        """
        config = self.config if config is None else config
        if params is None:
            if start is None or config.prox_mu:
                raise ValueError(
                    "ClientWork.train without a global model (params=None) needs per-client starts "
                    f"(start=) and no proximal term (prox_mu={config.prox_mu})."
                )
            # The engines take a reference model for names and shapes (and the proximal centre,
            # unused here): client 0's start.
            params = {k: v[0] for k, v in start.items()}
        return self.engine.train(
            self.model,
            params,
            self.datasets,
            config,
            self.seeds if seeds is None else list(seeds),
            start=start,
            linear=linear,
        )

    def derived_seeds(self, tag: int) -> list[int]:
        """Per-client seeds ``derive_seed(seed, t, i, tag)``: an independent stream per purpose.

        Args:
            tag: the purpose's tag (an integer constant of the strategy).

        Returns:
            ``list[int]``, one seed per selected client.
        """
        return [derive_seed(self.seed, self.round, i, tag) for i in self.client_ids.tolist()]


@dataclass
class ClientOutput:
    """What :meth:`Strategy.client_update` returns for the m selected clients.

    Attributes:
        deltas: ``{name: Tensor[m, ...]}`` the updates sent to the server.
        train_loss: ``Tensor[m]`` the clients' mean local loss (sent with the updates).
        signals: extra per-client reports (``Tensor[m, ...]`` values).
        state: new client-state rows ``{name: Tensor[m, ...]}`` (written back by the driver).
        recorded_loss: what ``History.train_loss`` records (default: ``train_loss``).
    """

    deltas: Params
    train_loss: Tensor
    signals: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    recorded_loss: Tensor | None = None


class Strategy(ABC):
    """The protocol's abstract base: a subclass defines :meth:`direction` and overrides the optional hooks it changes.

    The object holds hyper-parameters only; everything that changes during a run is in the
    server state (:meth:`init_state`) or the client state.

    **Required hook** (abstract: a class that does not define it cannot be built, and Python's
    ``TypeError`` names it): :meth:`direction`, the round's pseudo-gradient. A strategy without a
    server model (local-only training) returns an empty one and overrides :meth:`aggregate`.
    ``Strategy`` itself is abstract; plain local SGD on the clients (a Flower node's default)
    is :class:`~fedlearn_edu.strategies.fedavg.FedAvg`'s client side.

    **Optional hooks**, each with a default that is FedAvg's behaviour (``OPTIONAL_HOOKS``):
    :meth:`init_state` (server and client state at round 0), :meth:`server_params` /
    :meth:`with_server_params` (where the model lives in the state), :meth:`client_view`
    (what is broadcast), :meth:`configure_local` (the clients' settings),
    :meth:`client_signals` / :meth:`client_update` (the clients' round), :meth:`apply` /
    :meth:`step` / :meth:`init_optimizer_state` (the optimizer's step),
    :meth:`aggregate` (direction, then step), :meth:`nonfinite_hint`, :meth:`eval_models` and
    :meth:`min_clients_per_round` (what a sweep checks against its grid up front).

    Args:
        server_lr: server step size eta_s of the default ``ServerSGD(server_lr)`` (``None``:
            1.0). Not with ``optimizer``, which carries its own step size.
        optimizer: the :class:`~fedlearn_edu.strategies.server_optim.ServerOptimizer` that
            applies the direction (default ``ServerSGD(server_lr)``).

    Raises:
        TypeError: the class does not define :meth:`direction`; ``optimizer`` is not a
            ``ServerOptimizer``.
        ValueError: both ``server_lr`` and ``optimizer`` are given (the optimizer's step size
            would silently win), or the optimizer does not step against the direction.

    Class attributes, read by the driver and the Flower adapter:

    - ``needs``: the strategy's :class:`Needs` (client signals, validation set, server model,
      and what a wrapper must know of it: private, weighted direction, personalised).
    - ``evaluates``: which model ``History.client_accuracy`` is of: ``"global"``,
      ``"personal"`` or ``"cluster"``.
    - ``diagnostics``: optional per-round diagnostics the strategy needs recorded whatever the
      user asks (names from ``fedlearn_edu.simulation.DIAGNOSTICS``); none by default.
    - ``prox_argument``: the constructor argument that sets the clients' ``prox_mu`` in
      :meth:`configure_local` (FedProx's ``"mu"``, FedDyn's ``"alpha"``), so that a divergence
      it causes is blamed on it; ``""`` when there is none.
    - ``default_base``: for a strategy built on a base strategy (its constructor takes ``base``),
      the short name of the base its constructor uses when given none (Ditto's ``"fedavg"``);
      :func:`~fedlearn_edu.strategies.make_strategy` builds it with the arguments meant for it.
      ``None`` for the others (and for FedVG, which is its own FedAvg without a base).

    ``name`` is the short name; a class registers itself under it with
    :func:`~fedlearn_edu.strategies.register`.

    Where the server's model lives in the server state is said by :meth:`server_params` and
    :meth:`with_server_params` (``"params"`` by default; IFCA's ``"clusters"``, the
    decentralised methods' ``"models"``, a wrapper's base's). A strategy built on another one
    subclasses :class:`~fedlearn_edu.strategies.wrapper.Wrapper`, which forwards every hook to
    its base.
    """

    name = "strategy"
    needs: ClassVar[Needs] = Needs()
    evaluates = "global"
    diagnostics: tuple[str, ...] = ()
    prox_argument = ""
    default_base: str | None = None

    def __init__(self, server_lr: float | None = None, optimizer: ServerOptimizer | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        if optimizer is not None and server_lr is not None:
            raise ValueError(
                f"server_lr={server_lr!r} and optimizer={optimizer!r} both set the server's step size, and "
                "the optimizer's would silently win: give the step inside the optimizer (e.g. "
                "optimizer=chain(clip_by_global_norm(1.0), sgd(0.5)) for a step of 0.5) and drop server_lr, or "
                "drop optimizer."
            )
        if optimizer is not None and not isinstance(optimizer, ServerOptimizer):
            raise TypeError(
                "optimizer must be a ServerOptimizer (e.g. ServerAdam(), or a chain of transforms: "
                f"chain(clip_by_global_norm(1.0), sgd(1.0))), got {type(optimizer).__name__}."
            )
        if optimizer is not None and not (optimizer.lr is not None and optimizer.lr > 0):
            raise ValueError(
                f"optimizer {optimizer!r} has step size {optimizer.lr} along -g: it would not step against the "
                "direction (g points uphill). End a chain with sgd(lr), lr > 0, e.g. "
                "chain(clip_by_global_norm(1.0), sgd(1.0))."
            )
        if optimizer is None:
            optimizer = ServerSGD(1.0 if server_lr is None else check_positive(server_lr, "server_lr"))
        self.optimizer = optimizer

    @property
    def server_lr(self) -> float:
        """eta_s, the server optimizer's step size."""
        return self.optimizer.lr

    # ------------------------------------------------------------------ state
    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """The server state and the client state at round 0.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device.
            model: the architecture (IFCA initialises its other clusters from it).
            num_clients: N.
            seed: the run's seed.

        Returns:
            ``(server_state, client_state)``: a typed state
            (:class:`~fedlearn_edu.strategies.state.ServerState`; by default a
            :class:`~fedlearn_edu.strategies.state.ModelState` with ``params`` theta_0 and the
            optimizer's state), and ``{name: Tensor[N, ...]}`` (``{}`` by default).
        """
        return ModelState(params=params, optimizer=self.optimizer.init_state(params)), {}

    def server_params(self, server_state: Mapping) -> Params | None:
        """The server's model(s) in ``server_state``.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            server_state: the server state.

        Returns:
            ``server_state["params"]`` by default: one model ``{name: Tensor}`` (IFCA: stacked
            models ``{name: Tensor[K, ...]}``); ``None`` when there is no server model.
        """
        return server_state.get("params")

    def with_server_params(self, server_state: Mapping, params: Params) -> Mapping:
        """``server_state`` with ``params`` in place of the server's model(s) (the inverse of :meth:`server_params`).

        Optional hook (this default is FedAvg's behaviour).

        Args:
            server_state: the server state (not modified).
            params: the new model(s), shaped like :meth:`server_params`'s.

        Returns:
            A new server state: ``updated(server_state, params=params)`` by default (of
            ``server_state``'s type; a dict for a client view).
        """
        return updated(server_state, params=params)

    def client_view(self, server_state: Mapping) -> dict:
        """The part of the server state the clients read in :meth:`client_update` (what is broadcast).

        Optional hook (this default is FedAvg's behaviour).

        Args:
            server_state: the server state.

        Returns:
            The server's model alone by default, ``{"params": theta_t}`` (IFCA's
            ``{"clusters": ...}``; SCAFFOLD adds its control variate).
        """
        return self.with_server_params({}, self.server_params(server_state))

    # ------------------------------------------------------------- client side
    def configure_local(self, config: LocalTraining) -> LocalTraining:
        """The clients' local-training hyper-parameters this strategy asks for.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            config: the run's settings for the round.

        Returns:
            The settings the clients use (unchanged by default).
        """
        return config

    def client_signals(
        self,
        model: nn.Module,
        global_params: Params,
        local: LocalResult,
        datasets: Sequence[tuple[Tensor, Tensor]],
    ) -> dict:
        """Per-client values computed on the clients and sent with their updates (none by default).

        Optional hook (this default is FedAvg's behaviour).

        Args:
            model: the architecture.
            global_params: theta_t ``{name: Tensor}``.
            local: the clients' local training (``params`` ``Tensor[m, ...]``).
            datasets: the clients' training sets.

        Returns:
            ``{name: Tensor[m, ...]}``.
        """
        return {}

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """The selected clients' round: train from theta_t, report ``Delta_i`` and the signals.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            work: the round's clients, engine and settings.
            server_state: the server state (or the part of it the clients receive,
                :meth:`client_view`); not modified.
            state: the selected clients' rows of the client state ``{name: Tensor[m, ...]}``.

        Returns:
            The :class:`ClientOutput` of the m clients.
        """
        params = server_state["params"]
        local = work.train(params)
        signals = self.client_signals(work.model, params, local, work.datasets)
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        return ClientOutput(deltas, local.train_loss, signals)

    # ------------------------------------------------------------- server side
    @abstractmethod
    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """The round's pseudo-gradient, a pure function of its inputs (the required hook).

        Args:
            server_state: the server state (not modified).
            updates: the round's updates (not modified).

        Returns:
            ``(g, server_state, diagnostics)``: ``g`` shaped like the server's model, the server
            state with the strategy's own entries updated (the model and the optimizer's
            moments untouched: :meth:`aggregate` steps them), and the round's diagnostics.
        """
        raise NotImplementedError(f"{type(self).__name__} must define direction().")

    def nonfinite_hint(self) -> str:
        """Advice for a NaN/Inf direction computed from finite updates (``""``: none).

        Optional hook (this default is FedAvg's behaviour).
        """
        return ""

    def min_clients_per_round(self) -> int:
        """Optional hook: the fewest clients a round must have for the server step to work (1; Krum-type rules more).

        A sweep checks it against its grid before the first run (a grid that could never succeed).

        Returns:
            The smallest m.
        """
        return 1

    def apply(self, server_state: Mapping, g: Params, updates: ClientUpdates) -> Mapping:
        """Refuse a NaN/Inf direction, then :meth:`step` along ``g``.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            server_state: the state :meth:`direction` returned (not modified).
            g: the direction, shaped like :meth:`server_params`.
            updates: the round's updates (for the error message).

        Returns:
            The server state after :meth:`step`.

        Raises:
            FloatingPointError: ``g`` is NaN/Inf although the updates are finite.
        """
        bad = nonfinite_keys(g)
        if bad:
            hint = self.nonfinite_hint()
            raise FloatingPointError(
                f"Round {updates.round}: {self.name}'s aggregation turned finite client updates into a NaN/Inf "
                f"direction (in {bad[:3]}).{' ' + hint if hint else ''}"
            )
        return self.step(server_state, g)

    def step(self, server_state: Mapping, g: Params, optimizer: ServerOptimizer | None = None) -> Mapping:
        """The optimizer's step along ``g`` on the server's model, and what the strategy keeps after it.

        Optional hook (this default is FedAvg's behaviour).

        A strategy that keeps something of each new model (AFL's averaged iterate) overrides
        this hook, so that a wrapper stepping its model (:class:`~fedlearn_edu.strategies.wrapper.Wrapper`)
        keeps it too.

        Args:
            server_state: the state :meth:`direction` returned (not modified).
            g: the direction, shaped like :meth:`server_params`.
            optimizer: the optimizer that steps (default ``self.optimizer``; a wrapper passes its own),
                whose state is ``server_state["optimizer"]``.

        Returns:
            The server state with the new model and optimizer state.
        """
        optimizer = self.optimizer if optimizer is None else optimizer
        params, opt = optimizer.step(self.server_params(server_state), g, server_state["optimizer"])
        return updated(self.with_server_params(server_state, params), optimizer=opt)

    def init_optimizer_state(self, server_state: Mapping, optimizer: ServerOptimizer) -> Mapping:
        """``server_state`` with ``optimizer``'s initial state in place of the optimizer's state.

        Optional hook (this default is FedAvg's behaviour).

        A wrapper with an optimizer of its own calls it on its base's state (:meth:`step` then
        passes that optimizer).

        Args:
            server_state: the server state (not modified).
            optimizer: the optimizer that will step the server's model.

        Returns:
            A new server state.
        """
        return updated(server_state, optimizer=optimizer.init_state(self.server_params(server_state)))

    def aggregate(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Mapping, dict]:
        """One server step: :meth:`direction`, then the optimizer's step (:meth:`apply`); pure.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            server_state: the server state at round t (not modified).
            updates: the round's updates (not modified).

        Returns:
            ``(server_state at t + 1, diagnostics)``.
        """
        g, server_state, diag = self.direction(server_state, updates)
        return self.apply(server_state, g, updates), diag

    # -------------------------------------------------------------- evaluation
    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """The models the driver evaluates, the first one primary.

        Optional hook (this default is FedAvg's behaviour).

        Args:
            model: the architecture.
            server_state: the server state (on a Flower node: :meth:`client_view`).
            state: the client state ``{name: Tensor[N, ...]}``.
            train_sets: the clients' training sets (IFCA picks clusters on them).

        Returns:
            ``{label: (params, which)}``; ``which`` is ``None`` for one model (``params``
            unstacked) or ``Tensor[N]``: client i uses ``{k: v[which[i]] for k, v in params.items()}``
            of stacked ``params``.
        """
        return {"global": (server_state["params"], None)}

    def __repr__(self) -> str:
        """``Name(hyper-parameter=value, ...)``."""
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def check_base(outer: str, base, reweights: bool = True) -> None:
    """Refuse, at construction, a base strategy that ``outer`` (Ditto, FedVG) cannot be built on.

    Both build on the base's one global model (Ditto anchors the personal models at it,
    FedVG weighs the updates of it), so the base must keep exactly one server model and
    must not be personalised itself. What the base is comes from its :class:`Needs`.

    Args:
        outer: the composing strategy's name (for the message).
        base: the proposed base strategy.
        reweights: ``outer`` replaces the base's weighting of the clients' updates by
            data-dependent weights (FedVG; not Ditto, whose server step is its base's).

    Raises:
        TypeError: ``base`` is not a :class:`Strategy`.
        ValueError: ``base`` keeps K cluster models or none (IFCA, local-only, Gossip, DAC), is
            personalised (``needs.personal``: Ditto), or is differentially private
            (``needs.private``: DP-FedAvg) under a re-weighting ``outer`` (FedVG); the message
            names both strategies.
    """
    if not isinstance(base, Strategy):
        raise TypeError(f"{outer}'s base must be a fedlearn_edu Strategy (e.g. FedAvg()), got {type(base).__name__}.")
    name = getattr(base, "name", type(base).__name__)
    needs = base.needs
    if needs.server_model != "one":
        what = "K cluster models" if needs.server_model == "clusters" else "no global model"
        raise ValueError(
            f"{outer} over {name} cannot work: {outer} builds on its base's one global model, and {name} "
            f"keeps {what}. Use a one-model base (FedAvg, FedProx, SCAFFOLD, CRAFT, ...)."
        )
    if needs.private and reweights:
        raise ValueError(
            f"{outer} over {name} cannot work: {outer} re-weights the clients' updates by data-dependent "
            f"weights, which breaks {name}'s sensitivity bound (each client moves the clipped sum by at most C, "
            "over a fixed denominator): the privacy guarantee would not hold."
        )
    if needs.personal:
        raise ValueError(
            f"{outer} over {name} cannot work: {name} is already personalised (its clients keep their own "
            f"models). Build {outer} on {name}'s base instead."
        )

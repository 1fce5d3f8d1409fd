"""The strategy protocol: what one method does each round, for :func:`~fedlearn_edu.simulate`.

The driver (:func:`fedlearn_edu.simulate`) owns sampling, seeds, devices, the
engine, NaN checks, evaluation, checkpoints and History. A strategy says what
happens in between, in the FedJAX style ``init`` + per-round calls::

    strategy.init(params)                                          # reset server state
    params, state = strategy.init_state(params, model, N, seed)    # server params, client state
    # each round t, for the m selected clients:
    config = strategy.configure_local(config)                      # client hyper-parameters
    out = strategy.client_update(work, params, state_rows)         # ClientOutput (client side)
    params, diagnostics = strategy.aggregate(params, updates)      # server side
    # every eval_every rounds:
    strategy.eval_models(model, params, state, train_sets)         # which model each client uses

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
(:meth:`Strategy.aggregate`): SGD ``theta - eta_s g``, heavy-ball momentum,
Adam/Yogi/Adagrad. Any direction composes with any optimizer. ``aggregate`` and
``direction`` are plain functions of tensors and the strategy's own state, so a
Flower server (or any other caller) can use them outside :func:`simulate`.

How the methods map onto the protocol:

===========  =====================================================================================
FedAvg       direction ``-sum p_i Delta_i``; SGD. FedAvgM: the same with ``ServerMomentum``;
             FedAdam/FedYogi: with ``ServerAdam``/``ServerYogi``. FedProx: ``configure_local``
             sets ``prox_mu``.
FedVG        a weighting of the deltas (its direction) on top of any base strategy, whose
             ``configure_local``/``client_update`` it keeps, with any optimizer.
Ditto        client state ``personal`` (``Tensor[N, ...]``); ``client_update`` runs the base
             strategy's update and then the personal step (``start`` = personal rows, ``prox_mu``
             = lambda, anchor = theta_t); server side of the base; evaluated on the personal models.
IFCA         the server "params" are the K cluster models (``Tensor[K, ...]``); ``client_update``
             picks each client's cluster and trains from it (``start``); the direction is the
             per-cluster average; evaluated on each client's best cluster; client state
             ``cluster`` (``Tensor[N]``, the last pick).
Local only   client state ``personal``; no server step.
SCAFFOLD     client state ``c_i`` and server state ``c``; ``client_update`` trains with
             ``linear = c - c_i`` and returns the new ``c_i`` rows (option II:
             ``c_i - c + (theta_t - w_i) / (K lr)``, K = ``LocalResult.num_steps``) and
             ``signals["delta_c"]``; ``direction`` averages the deltas and updates ``c``.
FedDyn       client state ``grad_i`` (``Tensor[N, ...]``) and server state ``h``; ``configure_local``
             sets ``prox_mu = alpha``; ``client_update`` trains with ``linear = -grad_i`` and
             returns ``grad_i - alpha (w_i - theta_t)``; ``direction`` updates ``h`` and returns
             ``-(mean Delta) + h / alpha``.
FedNova      ``client_update`` adds ``signals["tau"] = LocalResult.num_steps``; ``direction`` is
             the normalised average ``-(sum p_i tau_i) sum p_i Delta_i / tau_i``.
===========  =====================================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..aggregators._checks import nonfinite_keys
from ..engine import LocalResult, LocalTraining
from ..params import Params
from ..utils import derive_seed
from .server_optim import ServerOptimizer, ServerSGD

__all__ = ["ClientUpdates", "ClientWork", "ClientOutput", "Strategy"]


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
    """

    round: int
    client_ids: Tensor
    deltas: Params
    num_samples: Tensor
    train_loss: Tensor
    model: nn.Module
    signals: dict = field(default_factory=dict)
    config: LocalTraining | None = None

    @property
    def num_clients(self) -> int:
        return int(self.client_ids.shape[0])

    @property
    def size_weights(self) -> Tensor:
        """``Tensor[m]``: p_i = n_i / sum_j n_j over the selected clients."""
        n = self.num_samples.to(torch.float64)
        return (n / n.sum()).to(next(iter(self.deltas.values())).dtype)

    def subset(self, keep: Tensor) -> ClientUpdates:
        """The updates of the clients where ``keep`` (``Tensor[m]``, bool) is true."""
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

    def train(
        self,
        params: Params,
        *,
        start: Params | None = None,
        linear: Params | None = None,
        config: LocalTraining | None = None,
        seeds: Sequence[int] | None = None,
    ) -> LocalResult:
        """Local training of the selected clients through the engine (the local-objective hook).

        Args:
            params: theta_t ``{name: Tensor}``: the start (unless ``start``) and the anchor.
            start: stacked ``{name: Tensor[m, ...]}`` per-client starting points.
            linear: stacked ``{name: Tensor[m, ...]}`` per-client linear terms.
            config: settings (default: the round's ``config``).
            seeds: batch-order seeds (default: the round's ``seeds``).
        """
        return self.engine.train(
            self.model,
            params,
            self.datasets,
            self.config if config is None else config,
            self.seeds if seeds is None else list(seeds),
            start=start,
            linear=linear,
        )

    def derived_seeds(self, tag: int) -> list[int]:
        """Per-client seeds ``derive_seed(seed, t, i, tag)``: an independent stream per purpose."""
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


class Strategy:
    """Base class. Subclasses override :meth:`direction` (and the other hooks as needed).

    Args:
        server_lr: server step size eta_s (used when ``optimizer`` is not given).
        optimizer: the :class:`~fedlearn_edu.strategies.server_optim.ServerOptimizer` that
            applies the direction (default ``ServerSGD(server_lr)``).

    Class attributes:
        single_model: the server's parameters are one model (conflicts are counted against
            its update); ``False`` for IFCA's clusters and local-only training.
        evaluates: which model ``History.client_accuracy`` is of: ``"global"``,
            ``"personal"`` or ``"cluster"``.
        diagnostics: optional per-round diagnostics the strategy needs recorded whatever the
            user asks (names from ``fedlearn_edu.simulation.DIAGNOSTICS``); none by default.
    """

    name = "strategy"
    single_model = True
    evaluates = "global"
    diagnostics: tuple[str, ...] = ()
    _state_names: tuple[str, ...] = ()

    def __init__(self, server_lr: float = 1.0, optimizer: ServerOptimizer | None = None):
        if optimizer is not None and not isinstance(optimizer, ServerOptimizer):
            raise TypeError(f"optimizer must be a ServerOptimizer (e.g. ServerAdam()), got {type(optimizer).__name__}.")
        self.optimizer = ServerSGD(server_lr) if optimizer is None else optimizer

    @property
    def server_lr(self) -> float:
        """eta_s, the server optimizer's step size."""
        return self.optimizer.lr

    # ------------------------------------------------------------------ state
    def init(self, params: Params) -> None:
        """Reset the server state (optimizer included) before round 1 (called by the simulator)."""
        self.optimizer.init(params)
        for name in self._state_names:
            setattr(self, name, None)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Params, dict]:
        """The server's parameters and the per-client state ``{name: Tensor[N, ...]}`` at round 0."""
        return params, {}

    def state_dict(self) -> dict:
        """The server state (tensors and plain values) a checkpoint stores."""
        return {"optimizer": self.optimizer.state_dict(), **{n: getattr(self, n) for n in self._state_names}}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])
        for name in self._state_names:
            setattr(self, name, state[name])

    # ------------------------------------------------------------- client side
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

    def client_update(self, work: ClientWork, params: Params, state: dict) -> ClientOutput:
        """The selected clients' round: train from theta_t, report ``Delta_i`` and the signals.

        Args:
            work: the round's clients, engine and settings.
            params: theta_t.
            state: the selected clients' rows of the client state ``{name: Tensor[m, ...]}``.
        """
        local = work.train(params)
        signals = self.client_signals(work.model, params, local, work.datasets)
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        return ClientOutput(deltas, local.train_loss, signals)

    # ------------------------------------------------------------- server side
    def direction(self, params: Params, updates: ClientUpdates) -> tuple[Params, dict]:
        """The pseudo-gradient ``g`` (``{name: Tensor}`` like ``params``) and diagnostics."""
        raise NotImplementedError(f"{type(self).__name__} must implement direction() or aggregate().")

    def nonfinite_hint(self) -> str:
        """Advice for a NaN/Inf direction computed from finite updates."""
        return ""

    def aggregate(self, params: Params, updates: ClientUpdates) -> tuple[Params, dict]:
        """Return ``(theta_{t+1}, diagnostics)``: :meth:`direction`, then the optimizer's step.

        Raises:
            FloatingPointError: the direction is NaN/Inf although the updates are finite.
        """
        g, diag = self.direction(params, updates)
        bad = nonfinite_keys(g)
        if bad:
            hint = self.nonfinite_hint()
            raise FloatingPointError(
                f"Round {updates.round}: {self.name}'s aggregation turned finite client updates into a NaN/Inf "
                f"direction (in {bad[:3]}).{' ' + hint if hint else ''}"
            )
        return self.optimizer.step(params, g), diag

    # -------------------------------------------------------------- evaluation
    def eval_models(self, model: nn.Module, params: Params, state: dict, train_sets) -> dict:
        """The models the driver evaluates: ``{label: (params, which)}``, the first one primary.

        ``which`` is ``None`` for one model (``params`` unstacked) or ``Tensor[N]``: client i uses
        ``{k: v[which[i]] for k, v in params.items()}`` of stacked ``params``.
        """
        return {"global": (params, None)}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"

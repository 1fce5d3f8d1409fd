"""The server side: any fedlearn_edu strategy as a Flower Message-API strategy.

**Flower's differential-privacy wrappers and SecAgg+ do not fit the adapter**; what happens
(flwr 1.42-1.x, checked by ``tests/flower/test_flower_privacy_wrappers.py``):

* ``DifferentialPrivacyClientSideFixedClipping`` + ``fixedclipping_mod``: the wrapper puts
  ``clipping_norm`` into Flower's config of the round, but :class:`FlowerStrategy` sends its own
  config record (the round's local-training settings), so the mod would find no clipping norm
  and every node would answer with an error; and the mod clips ``reply - sent`` and needs the
  reply's array names to equal the sent ones (``"params/fc.weight"`` sent, ``"fc.weight"``
  replied: an error reply). The adapter **refuses** the wrapper: :meth:`FlowerStrategy.configure_train`
  raises ``ValueError`` when Flower's config carries ``clipping_norm``.
* ``DifferentialPrivacyServerSideFixedClipping``: it treats every reply array as a model,
  replacing our Delta_i by ``theta_t + clip_C(Delta_i - theta_t)`` (a clipped distance to the
  global model, not a clipped update), which the wrapped strategy then aggregates as an update;
  and it adds its noise (``N(0, (z C / m)^2)``) to the ``ArrayRecord`` returned to Flower, not to
  the server state the adapter keeps and sends the nodes: the released model carries the noise,
  the model trained on does not. From round 2 on the wrapper clips against its noised copy
  theta~_t, so the strategy receives ``theta~_t + clip_C(Delta_i - theta~_t)``, which with
  noise much larger than the updates lies at distance C from theta~_t whatever the client sent.
  Neither the clipping nor the noise is DP-FedAvg's, and no privacy guarantee follows.
* ``SecAggPlusWorkflow`` + ``secaggplus_mod`` belong to Flower's legacy API: the workflow needs
  a ``LegacyContext`` whose strategy is a ``flwr.server.strategy.Strategy``
  (``configure_fit``/``aggregate_fit``; :class:`FlowerStrategy` is a Message-API
  ``flwr.serverapp.strategy.Strategy``), and the mod reads the reply as a ``FitRes``
  (``fitres.parameters``, ``fitres.num_examples``), which the adapter's reply is not. It
  returns only the ``num_examples``-weighted average of one vector per client. No strategy goes
  through it by this adapter; the ones that could run under such a secure sum are those with
  ``Strategy.needs.sums_only`` (:func:`fedlearn_edu.secagg.check_secure_aggregation`), and of
  them only the ones whose server step reads exactly ``sum n_i Delta_i / sum n_i`` (FedAvg,
  FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad; SCAFFOLD, FedDyn, FedNova and DP-FedAvg need
  other or further sums).

What to use instead: :class:`~fedlearn_edu.strategies.DPFedAvg` inside the adapter
(``FlowerStrategy(DPFedAvg(clip, noise_multiplier), model)``): the clipping, the noise and
the adaptive clipping norm are in the strategy's server step and state, so the nodes train
from the noised model and the run is accounted by :func:`fedlearn_edu.privacy.epsilon`
(central DP: the server sees the unclipped updates, as with Flower's server-side wrapper).
For secure aggregation, the simulation :mod:`fedlearn_edu.secagg`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy import Strategy as FlowerBaseStrategy
from flwr.supercore import log
from torch import nn

from ..checks import check_int, check_positive, check_range, check_seed
from ..evaluation import evaluation_due
from ..metrics import fairness_metrics
from ..params import Params, get_params
from ..round import local_training
from ..strategies.base import Strategy
from ..utils import derive_seed
from . import bridge
from .records import (
    arrays_to_params,
    config_to_record,
    diagnostics_to_metrics,
    params_to_arrays,
    record_to_reply,
    state_to_arrays,
)

__all__ = ["FlowerStrategy"]

# The key Flower's client-side DP wrappers put into the round's config (flwr.supercore.differential_privacy).
_FLOWER_CLIPPING_NORM = "clipping_norm"


class FlowerStrategy(FlowerBaseStrategy):
    """A ``flwr.serverapp.strategy.Strategy`` that runs a fedlearn_edu strategy.

    Each round it sends theta_t and the round's local-training hyper-parameters
    (``configure_local`` applied) to the sampled nodes, turns their replies (the updates of
    the strategy's ``client_update``, sizes, losses and client signals) into the stacked
    :class:`~fedlearn_edu.strategies.ClientUpdates` (``config`` = the round's
    hyper-parameters), and lets the wrapped strategy compute theta_{t+1} with
    ``aggregate`` (direction + server optimizer); its math is not copied here (see
    :mod:`fedlearn_edu.flower.bridge`). The strategy's server state (the model, the
    optimizer's moments, its own tensors) is kept here between rounds (:attr:`server_state`),
    as the nodes keep their client state; the nodes receive ``strategy.client_view`` of it.
    Server-side signals, such as FedVG's validation gradients, run here on the strategy's own
    data. Client state (Ditto's personal models, SCAFFOLD's ``c_i``) stays on the nodes. With
    the same partition, seed, strategy and hyper-parameters, and every client in every round,
    the global parameters equal those of :func:`~fedlearn_edu.simulate` (``engine="loop"``).

    Args:
        strategy: any fedlearn_edu strategy with one server model (``FedAvg()``, ``CRAFT()``,
            ``FedVG(val)``, ``Ditto()``, ...; not IFCA, local-only or decentralised training:
            ``strategy.needs.server_model`` must be ``"one"``); its server state starts afresh
            at round 1.
        model: the architecture (for server-side signals) and theta_0 (see :meth:`run`).
        local_epochs, batch_size, lr, lr_decay, momentum, weight_decay, seed: as in
            :func:`~fedlearn_edu.simulate`; sent to the nodes each round.
        fraction_train: share of the connected nodes trained each round (seeded sample).
        min_train_nodes: at least this many nodes are trained each round.
        min_available_nodes: wait until this many nodes are connected.
        fraction_evaluate: share of nodes that evaluate theta_{t+1} on their test split
            (0: no federated evaluation).
        eval_every: evaluate every k rounds (and after the last round of :meth:`run`), as
            :func:`~fedlearn_edu.simulate`'s ``eval_every``; on a real deployment every
            message starts a ClientApp process, so evaluating less often saves time.
        wait_s: how long to wait for ``min_available_nodes`` before giving up.
        device: where the server keeps theta_t and runs the strategy.

    Raises:
        TypeError: ``strategy`` or ``model`` of the wrong kind; a count, fraction, seed or
            ``wait_s`` that is not a number of its kind (strings and bools are refused, a float
            count or seed is not truncated).
        ValueError: a setting out of range (a negative seed, a fraction outside ``[0, 1]``), or a
            strategy without one server model.

    Attributes:
        server_state: the strategy's server state (``None`` before round 1).
        diagnostics: ``list[dict]``, per round what the strategy reported plus
            ``conflicts``, ``clients`` (partition ids aggregated), ``failed`` (node ids
            whose reply was an error), ``dropped`` (partition ids left out of the round by
            the bad-client policy, as ``simulate(..., on_nonfinite="skip")`` drops them),
            ``dropped_reasons`` (``{partition id: reason}``, the reasons of
            ``History.dropped``), ``train_loss`` (mean over the clients of the
            loss the simulator's History records) and ``seconds`` (wall time from sending
            theta_t to theta_{t+1}).
        evaluations: ``list[dict]``, per evaluated round ``{"round", "client_accuracy":
            {partition_id: accuracy}, "mean", "std", "worst10", "best10", "other_accuracy":
            {label: {partition_id: accuracy}}}`` (``client_accuracy`` is of the model the
            strategy evaluates a client on: Ditto's personal model, with ``other_accuracy
            ["global"]`` the global one's, as in the simulator's History).

    Example:
        >>> from fedlearn_edu import FedAvg, make_model
        >>> model = make_model("mlp", (1, 8, 8), 10)
        >>> strategy = FlowerStrategy(FedAvg(), model, lr=0.05, seed=0)
    """

    def __init__(
        self,
        strategy: Strategy,
        model: nn.Module,
        *,
        local_epochs: int = 1,
        batch_size: int = 10,
        lr: float = 0.05,
        lr_decay: float = 1.0,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        seed: int = 0,
        fraction_train: float = 1.0,
        min_train_nodes: int = 1,
        min_available_nodes: int = 1,
        fraction_evaluate: float = 1.0,
        eval_every: int = 1,
        wait_s: float = 300.0,
        device: str | torch.device = "cpu",
    ):
        """Check the arguments (see the class docstring) and keep them."""
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a fedlearn_edu Strategy (e.g. FedAvg()), got {type(strategy).__name__}.")
        bridge.check_one_model(strategy)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        base_config, lr_decay = local_training(local_epochs, batch_size, lr, lr_decay, momentum, weight_decay)
        self.strategy = strategy
        self.model = model
        self.base_config = base_config
        self.lr_decay = lr_decay
        self.seed = check_seed(seed)  # a float is refused, not truncated
        self.fraction_train = check_range(fraction_train, "fraction_train", 0, 1)
        self.min_train_nodes = check_int(min_train_nodes, "min_train_nodes", 1)
        self.min_available_nodes = check_int(min_available_nodes, "min_available_nodes", 1)
        self.fraction_evaluate = check_range(fraction_evaluate, "fraction_evaluate", 0, 1)
        self.eval_every = check_int(eval_every, "eval_every", 1)
        self._rounds: int | None = None
        self.wait_s = check_positive(wait_s, "wait_s")
        self.device = torch.device(device)
        self.diagnostics: list[dict] = []
        self.evaluations: list[dict] = []
        self.server_state: Mapping | None = None
        self._config = None
        self._started = False
        self._round_start = 0.0

    # -- Flower's Strategy interface ---------------------------------------------------------

    def summary(self) -> None:
        """Log the wrapped strategy and the clients' hyper-parameters."""
        log(INFO, "\t├──> fedlearn_edu strategy: %r", self.strategy)
        log(INFO, "\t├──> local training: %s, lr_decay %g, seed %d", self.base_config, self.lr_decay, self.seed)
        log(
            INFO,
            "\t└──> sampling: fraction_train %.2f, fraction_evaluate %.2f",
            self.fraction_train,
            self.fraction_evaluate,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the clients' view of the server state and the round's hyper-parameters to the sampled nodes.

        Round 1 starts the server state from ``arrays`` (theta_0); later rounds use the state
        kept here (``arrays``, Flower's copy of theta_t, then equals its model).

        Args:
            server_round: t (1-based).
            arrays: Flower's current global parameters (read in round 1 only, as theta_0).
            config: Flower's config of the round (unused: the round's settings come from this
                object's hyper-parameters and the strategy's ``configure_local``).
            grid: the grid whose connected nodes are sampled (seeded, ``fraction_train``).

        Returns:
            ``list[Message]``, one ``train`` message per sampled node: ``"arrays"`` the
            strategy's ``client_view`` and ``"config"`` the round's settings.

        Raises:
            TimeoutError: fewer than ``min_available_nodes`` nodes connected within ``wait_s``.
            ValueError: Flower's ``config`` carries ``clipping_norm`` (a client-side DP wrapper,
                which does not fit the adapter's replies; see the module docstring).
        """
        if _FLOWER_CLIPPING_NORM in config:
            raise ValueError(
                "FlowerStrategy cannot run inside Flower's DifferentialPrivacyClientSideFixedClipping (or its "
                f"adaptive variant; Flower's round config carries {_FLOWER_CLIPPING_NORM!r}): the nodes reply with "
                "updates Delta_i, which fixedclipping_mod would treat as model parameters. Use "
                "FlowerStrategy(DPFedAvg(clip=C, noise_multiplier=z), model) instead "
                "(see fedlearn_edu.flower.server)."
            )
        nodes = self._sample(grid, self.fraction_train, self.min_train_nodes, server_round, salt=0x7EA1)
        if not self._started:
            num_nodes = len(list(grid.get_node_ids()))
            params = arrays_to_params(arrays, self.device)
            self.server_state = bridge.begin_run(self.strategy, params, self.model, num_nodes, self.seed)
            self._started = True
        self._round_start = time.perf_counter()
        local = bridge.round_config(self.strategy, self.base_config, self.lr_decay, server_round)
        self._config = local
        view = state_to_arrays(self.strategy.client_view(self.server_state))
        content = RecordDict({"arrays": view, "config": config_to_record(local, server_round, self.seed)})
        return [Message(content, node, MessageType.TRAIN, group_id=str(server_round)) for node in nodes]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """theta_{t+1} from the replies, by the wrapped strategy.

        A reply that is an error (the node failed) is left out of the round and recorded, and
        so is a client the simulator's bad-client policy drops (:mod:`fedlearn_edu.round`: its
        update or a signal holds NaN/Inf, or its node reported its new client state did); a
        reply that lacks what the strategy needs (parameters, sizes, a client signal such as
        FedOUI's ``oui``) raises ``ValueError``.

        Args:
            server_round: t.
            replies: the nodes' ``train`` replies (layout in :mod:`fedlearn_edu.flower.records`).

        Returns:
            ``(theta_{t+1} as an ArrayRecord, the round's diagnostics as a MetricRecord)``, or
            ``(None, None)`` when no reply is usable (theta stays as it was).

        Raises:
            RuntimeError: called before :meth:`configure_train`.
            ValueError: a reply is malformed or lacks what the strategy needs.
        """
        if self.server_state is None:
            raise RuntimeError("aggregate_train was called before configure_train; run the strategy with start().")
        failed, received = [], []
        for msg in replies:
            if msg.has_error():
                failed.append(int(msg.metadata.src_node_id))
                log(WARNING, "Node %d failed in round %d: %s", msg.metadata.src_node_id, server_round, msg.error.reason)
            else:
                received.append(record_to_reply(msg.content, int(msg.metadata.src_node_id)))
        params = self.strategy.server_params(self.server_state)
        updates, dropped = None, {}
        if received:
            updates = bridge.client_updates(self.strategy, server_round, self.model, params, received, self._config)
            updates, dropped = bridge.drop_bad_clients(updates, received)
        if dropped:
            log(WARNING, "Round %d: partition(s) left out: %s", server_round, dropped)
        if updates is None:
            self.diagnostics.append(
                {"round": server_round, "clients": [], "failed": failed, **_dropped_entries(dropped)}
            )
            log(WARNING, "Round %d: no usable reply; theta stays as it was.", server_round)
            return None, None
        kept = [r for r in received if r.client_id not in dropped]
        recorded = [r.train_loss if r.recorded_loss is None else r.recorded_loss for r in kept]
        self.server_state, diag = bridge.server_update(self.strategy, self.server_state, updates)
        new_params = self.strategy.server_params(self.server_state)
        diag = {
            **diag,
            "round": server_round,
            "clients": updates.client_ids.tolist(),
            "failed": failed,
            **_dropped_entries(dropped),
            "train_loss": float(torch.stack(recorded).mean()),
            "seconds": time.perf_counter() - self._round_start,
        }
        self.diagnostics.append(diag)
        return params_to_arrays(new_params), diagnostics_to_metrics(diag)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask the sampled nodes to evaluate their models (from the clients' view of the server state).

        Args:
            server_round: t; nodes evaluate only every ``eval_every`` rounds and after the last.
            arrays: Flower's current global parameters (unused: the view is of the server state kept here).
            config: Flower's config of the round (unused).
            grid: the grid whose nodes are sampled (seeded, ``fraction_evaluate``, at least one).

        Returns:
            ``list[Message]``, one ``evaluate`` message per sampled node; ``[]`` when evaluation
            is off (``fraction_evaluate=0``), not due this round, or before any training round.
        """
        due = evaluation_due(server_round, self.eval_every, self._rounds)
        if self.fraction_evaluate == 0 or not due or self.server_state is None:
            return []
        nodes = self._sample(grid, self.fraction_evaluate, 1, server_round, salt=0xE7A1)
        config = ConfigRecord({"server-round": int(server_round), "seed": self.seed})
        view = state_to_arrays(self.strategy.client_view(self.server_state))
        content = RecordDict({"arrays": view, "config": config})
        return [Message(content, node, MessageType.EVALUATE, group_id=str(server_round)) for node in nodes]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Fairness metrics (mean, std, worst10, best10) of the nodes' test accuracies.

        The accuracy is of the model the strategy evaluates each client on (Ditto: the
        node's personal model); the others a node reports (``accuracy.global``) are kept in
        ``evaluations[-1]["other_accuracy"]``.

        Args:
            server_round: t.
            replies: the nodes' ``evaluate`` replies; errors and replies without
                ``accuracy``/``partition-id`` metrics are skipped.

        Returns:
            ``MetricRecord`` of ``mean``, ``std``, ``worst10``, ``best10`` and ``num-clients``
            (also appended to :attr:`evaluations`), or ``None`` without a usable (non-NaN) accuracy.
        """
        accuracy, other = {}, {}
        for msg in replies:
            if msg.has_error() or "metrics" not in msg.content:
                continue
            metrics = msg.content["metrics"]
            if "accuracy" in metrics and "partition-id" in metrics:
                pid = int(metrics["partition-id"])
                accuracy[pid] = float(metrics["accuracy"])
                for key, value in metrics.items():
                    if key.startswith("accuracy."):
                        other.setdefault(key[len("accuracy.") :], {})[pid] = float(value)
        values = [a for a in accuracy.values() if not math.isnan(a)]
        if not values:
            return None
        summary = fairness_metrics(values)
        self.evaluations.append(
            {
                "round": server_round,
                "client_accuracy": dict(sorted(accuracy.items())),
                **summary,
                "other_accuracy": {k: dict(sorted(v.items())) for k, v in other.items()},
            }
        )
        return MetricRecord({**summary, "num-clients": len(values)})

    # -- conveniences --------------------------------------------------------------------------

    def run(self, grid: Grid, rounds: int, timeout: float = 3600) -> Result:
        """Run ``rounds`` rounds from the model's parameters (theta_0) with Flower's ``start``.

        Resets :attr:`server_state`, :attr:`diagnostics` and :attr:`evaluations` first.

        Args:
            grid: the Flower ``Grid`` (a :class:`~fedlearn_edu.flower.LocalGrid`, or the
                ServerApp's grid).
            rounds: the number of rounds (a positive integer).
            timeout: seconds Flower's ``start`` waits for the nodes' replies.

        Returns:
            Flower's ``Result`` (``result.arrays`` holds the final global parameters; see
            :meth:`final_params`).

        Raises:
            TypeError, ValueError: ``rounds`` is not an integer >= 1.
        """
        rounds = check_int(rounds, "rounds", 1)
        self._started = False
        self.server_state = None
        self._rounds = rounds
        self.diagnostics, self.evaluations = [], []
        return self.start(grid, params_to_arrays(get_params(self.model)), num_rounds=int(rounds), timeout=timeout)

    def final_params(self) -> Params:
        """The last global parameters, ``{name: Tensor}`` on the CPU."""
        if self.server_state is None:
            raise RuntimeError("No round has run yet.")
        return {k: v.detach().cpu() for k, v in self.strategy.server_params(self.server_state).items()}

    def _sample(self, grid: Grid, fraction: float, minimum: int, server_round: int, salt: int) -> list[int]:
        """Wait (bounded) for enough nodes, then a seeded sample of them, sorted."""
        deadline = time.monotonic() + self.wait_s
        while len(nodes := sorted(int(n) for n in grid.get_node_ids())) < self.min_available_nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Only {len(nodes)} of the {self.min_available_nodes} nodes needed connected within "
                    f"{self.wait_s:g} s; start more SuperNodes or lower min_available_nodes."
                )
            time.sleep(0.5)
        k = min(len(nodes), max(minimum, int(len(nodes) * fraction)))
        generator = torch.Generator().manual_seed(derive_seed(self.seed, server_round, salt))
        pick = torch.randperm(len(nodes), generator=generator)[:k].sort().values
        return [nodes[i] for i in pick.tolist()]


def _dropped_entries(dropped: dict[int, str]) -> dict:
    """The diagnostics of the clients the bad-client policy dropped: ids, and ids with reasons."""
    return {"dropped": sorted(dropped), "dropped_reasons": dict(sorted(dropped.items()))}

"""The round driver: one loop for every method (global, personalised, clustered).

One round t:

1. sample ``clients_per_round`` clients without replacement (seeded);
2. the strategy's client update trains them through the engine (the strategy may change
   the local config and the local objective, and reads/writes its per-client state);
3. a client whose update, new client state or signal is non-finite raises, or is dropped
   for the round (``on_nonfinite``; the policy is :func:`fedlearn_edu.round.bad_clients`);
4. the strategy aggregates the updates into the new server state (direction + server
   optimizer; a pure function of the server state and the updates);
5. every ``eval_every`` rounds the models the strategy names (the global model, or
   each client's personal / cluster model) are evaluated on *every* client's local
   test split (per-client accuracy and loss);
6. every ``checkpoint_every`` rounds everything the next round needs is saved.
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from . import checkpoint as _ckpt
from .aggregators import count_conflicts
from .attacks import Attack
from .checkpoint import CHECKPOINT_VERSION
from .checks import (
    check_bool,
    check_float,
    check_int,
    check_model_data,
    check_seed,
    check_trainable,
    nonfinite_keys,
)
from .data.federation import Federation
from .data.noise import reverse_labels
from .engine import MAX_EPOCHS, LocalTraining, make_engine
from .metrics import METRIC_NAMES, fairness_metrics
from .params import Params, get_params, select_rows
from .round import DATA_REASON, UPDATE_REASON, bad_clients
from .secagg import check_secure_aggregation
from .strategies.base import ClientUpdates, ClientWork, Strategy
from .utils import derive_seed, resolve_device

__all__ = ["simulate", "History", "evaluate_clients", "ON_NONFINITE", "DIAGNOSTICS"]

ON_NONFINITE = ("raise", "skip")
# Per-round diagnostics computed on request (simulate's ``diagnostics``, a strategy's own):
# "conflicts" -- how many selected clients' updates have a negative inner product with the
# applied update, whole model and per layer group (an extra pass over all the updates).
DIAGNOSTICS = ("conflicts",)


@dataclass
class History:
    """What a simulation recorded.

    Attributes:
        strategy: the strategy's name.
        eval_rounds: ``list[int]`` rounds at which the global model was evaluated
            (0 = the initial model).
        client_accuracy: ``ndarray[E, N]`` accuracy of the global model on each of the N
            clients' local test splits, one row per evaluation.
        client_loss: ``ndarray[E, N]`` mean cross-entropy, same layout.
        train_loss: ``list[float]`` per round, mean local training loss of the selected clients.
        selected: ``list[ndarray[m]]`` per round, the selected client ids.
        diagnostics: ``list[dict]`` per round, what the strategy reported (e.g. ``weights``)
            plus, when recorded, ``conflicts`` (clients whose update has a negative inner
            product with the applied update) and ``conflicts_per_layer``.
        config: the simulation's settings; ``config["diagnostics"]`` names the optional
            diagnostics recorded (see ``simulate``'s ``diagnostics``).
        seconds: wall-clock time of the run.
        final_params: the last global parameters (on the CPU); IFCA: the stacked cluster models;
            decentralised methods: the N client models; ``None`` for local-only training.
        evaluated: which model ``client_accuracy`` is of: ``"global"``, ``"personal"`` (each
            client's own model), ``"cluster"`` (each client's cluster model) or ``"average"``
            (AFL with ``iterate="average"``: the averaged iterate of Mohri et al.).
        other_accuracy: ``{model: ndarray[E, N]}`` accuracies of the other models the
            strategy evaluates (Ditto: ``{"global": ...}``; AFL's averaged iterate: ``{"last": ...}``).
        model_index: ``ndarray[E, N]`` for stacked models: the model client i used at each
            evaluation (IFCA: its cluster); ``None`` for one global model.
        dropped: per round, ``{client id: reason}`` of the clients dropped by
            ``on_nonfinite="skip"`` (empty when none); the reason names the bad part (its data,
            the update, a new client-state entry or a signal: :mod:`fedlearn_edu.round`).
        final_state: the strategy's client state at the end, ``{name: Tensor[N, ...]}`` (CPU).
        final_server_state: the strategy's server state at the end (CPU; see
            :meth:`~fedlearn_edu.strategies.Strategy.init_state`).
        attackers: ``ndarray[k]`` the ids of the attacking clients of ``simulate(..., attack=)``
            (``None`` without an attack).
    """

    strategy: str
    eval_rounds: list = field(default_factory=list)
    client_accuracy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    client_loss: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    train_loss: list = field(default_factory=list)
    selected: list = field(default_factory=list)
    diagnostics: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    seconds: float = 0.0
    final_params: Params | None = None
    evaluated: str = "global"
    other_accuracy: dict = field(default_factory=dict)
    model_index: np.ndarray | None = None
    dropped: list = field(default_factory=list)
    final_state: dict = field(default_factory=dict)
    final_server_state: dict = field(default_factory=dict)
    attackers: np.ndarray | None = None

    def metrics(self, index: int = -1) -> dict[str, float]:
        """Fairness metrics (mean, std, worst10, best10) at evaluation ``index`` (default: last).

        Args:
            index: the row of ``client_accuracy`` (Python indexing: -1 is the last evaluation).

        Returns:
            ``{"round": eval_rounds[index], "mean": ..., "std": ..., "worst10": ..., "best10": ...}``.

        Raises:
            ValueError: the History holds no evaluation.
        """
        if len(self.eval_rounds) == 0:
            raise ValueError("This History holds no evaluation yet.")
        out = fairness_metrics(self.client_accuracy[index])
        return {"round": self.eval_rounds[index], **out}

    def curve(self, metric: str = "mean") -> np.ndarray:
        """``ndarray[E]``: a fairness metric at every evaluation round.

        Args:
            metric: one of ``"mean"``, ``"std"``, ``"worst10"``, ``"best10"``.

        Returns:
            ``ndarray[E]``, one value per row of ``client_accuracy``.

        Raises:
            ValueError: ``metric`` is not one of those.
        """
        if metric not in METRIC_NAMES:
            raise ValueError(f"Unknown metric {metric!r}; choose one of {sorted(METRIC_NAMES)}.")
        return np.array([fairness_metrics(row)[metric] for row in self.client_accuracy])

    def best(self, metric: str = "mean") -> float:
        """Best value of ``metric`` over the evaluations (max; min for ``std``).

        Args:
            metric: one of ``"mean"``, ``"std"``, ``"worst10"``, ``"best10"``.

        Returns:
            The maximum of :meth:`curve` (the minimum for ``"std"``), a float.

        Raises:
            ValueError: ``metric`` is not one of those.
        """
        c = self.curve(metric)
        return float(c.min() if metric == "std" else c.max())

    @property
    def conflicts(self) -> np.ndarray:
        """``ndarray[T]``: per round, how many selected clients conflict with the applied update.

        Recorded only on request: ``simulate(..., diagnostics=("conflicts",))``.
        """
        if "conflicts" not in self.config.get("diagnostics", DIAGNOSTICS):
            raise ValueError(
                "This run did not record conflict counts: pass diagnostics=('conflicts',) to simulate "
                "(they cost an extra pass over every update, so they are computed only on request)."
            )
        return np.array([d["conflicts"] for d in self.diagnostics])

    def summary(self) -> str:
        """A text table of the fairness metrics at each evaluation (at most ~8 rows)."""
        return format_table({self.strategy: self}, every=True)

    def to_state(self) -> dict:
        """The History as tensors and plain containers (what a checkpoint stores)."""
        return {
            "strategy": self.strategy,
            "eval_rounds": list(self.eval_rounds),
            "client_accuracy": torch.as_tensor(self.client_accuracy),
            "client_loss": torch.as_tensor(self.client_loss),
            "train_loss": list(self.train_loss),
            "selected": [torch.as_tensor(s) for s in self.selected],
            "diagnostics": _plain(self.diagnostics),
            "evaluated": self.evaluated,
            "other_accuracy": {k: torch.as_tensor(v) for k, v in self.other_accuracy.items()},
            "model_index": None if self.model_index is None else torch.as_tensor(self.model_index),
            "dropped": [dict(d) for d in self.dropped],
        }

    @classmethod
    def from_state(cls, state: dict, config: dict) -> History:
        """Inverse of :meth:`to_state`.

        Args:
            state: a dict as :meth:`to_state` returns it (tensors become NumPy arrays again).
            config: the run's settings, stored as ``History.config`` (not part of ``state``).

        Returns:
            The :class:`History`; ``seconds``, ``final_params`` and the final states keep their
            defaults (``to_state`` does not store them).
        """
        return cls(
            strategy=state["strategy"],
            eval_rounds=list(state["eval_rounds"]),
            client_accuracy=state["client_accuracy"].numpy(),
            client_loss=state["client_loss"].numpy(),
            train_loss=list(state["train_loss"]),
            selected=[s.numpy() for s in state["selected"]],
            diagnostics=list(state["diagnostics"]),
            config=config,
            evaluated=state["evaluated"],
            other_accuracy={k: v.numpy() for k, v in state["other_accuracy"].items()},
            model_index=None if state["model_index"] is None else state["model_index"].numpy(),
            dropped=[dict(d) for d in state["dropped"]],
        )


def _plain(obj):
    """``obj`` with NumPy arrays/scalars turned into tensors/Python numbers (for ``weights_only`` loading)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _map_tensors(fn, obj):
    """``fn`` applied to every tensor in a nested dict/list/tuple (other values unchanged)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, v) for v in obj)
    return obj


def _to(obj, device):
    """Every tensor in a nested dict/list/tuple moved to ``device``."""
    return _map_tensors(lambda t: t.to(device), obj)


def format_table(histories: dict[str, History], every: bool = False) -> str:
    """Text table of fairness metrics.

    Args:
        histories: ``{label: History}``.
        every: one row per evaluation (at most ~8 per run) instead of the final one.

    Returns:
        The table as text.
    """
    w = max([12, *(len(name) + 2 for name in histories)])
    head = f"{'strategy':<{w}}{'round':>6}{'mean':>8}{'std':>8}{'worst10':>9}{'best10':>8}"
    lines = [head, "-" * len(head)]
    for name, h in histories.items():
        n = len(h.eval_rounds)
        idx = [n - 1]
        if every:
            stride = max(1, math.ceil(n / 8))
            idx = sorted(set(range(0, n, stride)) | {n - 1})
        for i in idx:
            m = h.metrics(i)
            lines.append(
                f"{name:<{w}}{m['round']:>6}{m['mean']:>8.3f}{m['std']:>8.3f}{m['worst10']:>9.3f}{m['best10']:>8.3f}"
            )
    return "\n".join(lines)


class _TestSet:
    """All clients' local test splits concatenated once, with the owner of every sample."""

    def __init__(self, federation: Federation, device: torch.device):
        self.x = torch.cat([c.test_x for c in federation]).to(device)
        self.y = torch.cat([c.test_y for c in federation]).to(device)
        self.owner = torch.cat([torch.full((c.num_test,), i, dtype=torch.long) for i, c in enumerate(federation)]).to(
            device
        )
        self.counts = torch.bincount(self.owner, minlength=len(federation)).double()
        self.num_clients = len(federation)


@torch.no_grad()
def evaluate_clients(
    model: nn.Module,
    params: Params,
    federation: Federation,
    batch_size: int = 2048,
    which: Tensor | None = None,
    _test: _TestSet | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean loss, on every client's local test split, of the model that client uses.

    Args:
        model: the architecture (used through ``functional_call``).
        params: one model ``{name: Tensor}`` used by every client (``which=None``), or K
            stacked models ``{name: Tensor[K, ...]}``.
        federation: the clients.
        batch_size: test samples per forward pass.
        which: ``Tensor[N]`` (int64): client i uses model ``which[i]`` of the stacked
            ``params`` (``torch.arange(N)``: each client its own personal model; IFCA: the
            cluster ids).

    Returns:
        ``(accuracy: ndarray[N], loss: ndarray[N])``; NaN for a client without test samples.
    """
    names = {n for n, _ in model.named_parameters()}
    missing, unknown = sorted(names - set(params)), sorted(set(params) - names - {n for n, _ in model.named_buffers()})
    if missing or unknown:
        raise ValueError(
            f"params must hold exactly the model's parameters: missing {missing[:5]}, unknown {unknown[:5]} "
            f"(a missing or misspelt key would silently use the module's own tensor)."
        )
    device = next(iter(params.values())).device
    test = _test or _TestSet(federation, device)
    if which is not None and tuple(which.shape) != (test.num_clients,):
        raise ValueError(f"which must be Tensor[N] with N = {test.num_clients} clients; got {tuple(which.shape)}.")
    correct = torch.zeros(test.num_clients, dtype=torch.float64, device=device)
    loss = torch.zeros(test.num_clients, dtype=torch.float64, device=device)
    # One group of test samples per model: all samples for one global model, else the samples
    # of the clients that use model j.
    groups = [None] if which is None else torch.unique(which).tolist()
    sample_model = None if which is None else which.to(device)[test.owner]
    for j in groups:
        p = params if j is None else {k: v[j] for k, v in params.items()}
        idx = None if j is None else (sample_model == j).nonzero().flatten()
        x, y, owner = (test.x, test.y, test.owner) if idx is None else (test.x[idx], test.y[idx], test.owner[idx])
        for start in range(0, y.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            logits = functional_call(model, p, (x[sl],))
            correct.index_add_(0, owner[sl], (logits.argmax(1) == y[sl]).double())
            loss.index_add_(0, owner[sl], F.cross_entropy(logits, y[sl], reduction="none").double())
    counts = test.counts.to(device)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = (correct / counts).cpu().numpy()
        mean_loss = (loss / counts).cpu().numpy()
    return acc, mean_loss


def check_run_arguments(
    federation, rounds, clients_per_round, eval_every, lr_decay, *, model=None, seed=0, strategy=None
) -> None:
    """Validate the arguments every simulation loop shares (clear errors at the public boundary).

    Args:
        federation: must be a :class:`~fedlearn_edu.data.Federation`.
        rounds: positive integer (``"2"``, ``2.5`` and NaN are refused, not converted).
        clients_per_round: positive integer.
        eval_every: positive integer.
        lr_decay: a number in ``(0, 1]``.
        model: when given, checked once against the data: no BatchNorm (see
            :func:`~fedlearn_edu.checks.check_trainable`), input shape, number of classes
            and dtype (:func:`~fedlearn_edu.checks.check_model_data`), and the strategy's
            server validation set if it declares one (``strategy.needs.validation``: FedVG).
        seed: non-negative integer.
        strategy: the strategy, for its validation set (``strategy.validation_data``).

    Raises:
        TypeError: a wrong type (a string for a count, a model that is not a module).
        ValueError: a value out of range, or a model that does not fit the data.
    """
    if not isinstance(federation, Federation):
        raise TypeError(f"federation must be a fedlearn_edu Federation, got {type(federation).__name__}.")
    for name, v in (("rounds", rounds), ("clients_per_round", clients_per_round), ("eval_every", eval_every)):
        check_int(v, name, 1)
    check_lr_decay(lr_decay)
    check_seed(seed)
    if model is None:
        return
    check_trainable(model)
    data_name = federation.name or "federation"
    check_model_data(model, federation.input_shape, federation.num_classes, data_name, federation[0].train_x.dtype)
    if strategy is not None and strategy.needs.validation:
        x_val, y_val = strategy.validation_data
        if tuple(x_val.shape[1:]) != tuple(federation.input_shape):
            raise ValueError(
                f"val_data of {type(strategy).__name__} (the server validation set) has inputs of shape "
                f"{tuple(x_val.shape[1:])}, but data set {data_name!r} has {tuple(federation.input_shape)}."
            )
        if y_val.numel() and (int(y_val.min()) < 0 or int(y_val.max()) >= federation.num_classes):
            raise ValueError(
                f"val_data of {type(strategy).__name__} (the server validation set) has labels outside "
                f"[0, {federation.num_classes - 1}] (data set {data_name!r})."
            )


def check_lr_decay(lr_decay) -> float:
    """Check the client learning-rate decay (``simulate``'s and the Flower server's ``lr_decay``).

    Args:
        lr_decay: a number in ``(0, 1]``.

    Returns:
        ``lr_decay`` as a float.

    Raises:
        TypeError: not a number.
        ValueError: outside ``(0, 1]``.
    """
    lr_decay = check_float(lr_decay, "lr_decay")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}.")
    return lr_decay


def local_training(
    local_epochs: int, batch_size: int, lr: float, lr_decay: float, momentum: float, weight_decay: float
) -> tuple[LocalTraining, float]:
    """The clients' settings of a run, checked (``simulate``'s and the Flower server's arguments).

    Args:
        local_epochs: local epochs per round (:class:`~fedlearn_edu.engine.LocalTraining` checks
            this and the other local settings).
        batch_size: local mini-batch size.
        lr: the client learning rate of round 1.
        lr_decay: the client rate of round t is ``lr * lr_decay**(t - 1)``; in ``(0, 1]``.
        momentum: local SGD momentum.
        weight_decay: local weight decay.

    Returns:
        ``(LocalTraining, lr_decay)``.

    Raises:
        TypeError, ValueError: a setting of the wrong type or out of range.
    """
    local_epochs = check_int(local_epochs, "local_epochs", 1, MAX_EPOCHS)  # the caller's name (LocalTraining's: epochs)
    return LocalTraining(local_epochs, batch_size, lr, momentum, weight_decay), check_lr_decay(lr_decay)


def round_config(strategy: Strategy, base: LocalTraining, lr_decay: float, round: int) -> LocalTraining:
    """The local-training hyper-parameters of round ``round`` (1-based), for every caller.

    The client rate decays as ``lr * lr_decay**(round - 1)``, then the strategy may change the
    config (:meth:`~fedlearn_edu.strategies.Strategy.configure_local`: FedProx's mu).

    Args:
        strategy: the run's strategy.
        base: the run's :class:`~fedlearn_edu.engine.LocalTraining`.
        lr_decay: the decay in ``(0, 1]``.
        round: t, an integer >= 1.

    Returns:
        The round's :class:`~fedlearn_edu.engine.LocalTraining`.

    Raises:
        TypeError, ValueError: ``lr_decay`` outside ``(0, 1]`` (:func:`check_lr_decay`; not blamed on
            the rate it would make), ``round`` not an integer >= 1.
    """
    lr_decay, round = check_lr_decay(lr_decay), check_int(round, "round", 1)
    return strategy.configure_local(base.replace(lr=base.lr * lr_decay ** (round - 1)))


def server_step(
    strategy: Strategy, server_state: dict, updates: ClientUpdates, name: str, conflicts: bool = True
) -> tuple[dict, dict]:
    """One aggregation: ``strategy.aggregate`` plus (``conflicts``) the conflict counts of the applied update.

    Args:
        strategy: the run's strategy.
        server_state: the server state at round t (not modified).
        updates: the round's (finite) updates.
        name: the strategy's name, for messages.
        conflicts: count the clients whose update conflicts with the applied one (one-model
            strategies only).

    Returns:
        ``(server state at t + 1, its tensors detached; the round's diagnostics on the CPU)``.

    Raises:
        FloatingPointError: the server parameters became NaN/Inf although every client update
            was finite (the server step, not local training, is at fault).
    """
    new_state, diag = strategy.aggregate(server_state, updates)
    new_state = _map_tensors(Tensor.detach, new_state)
    new_params = strategy.server_params(new_state) or {}
    _check_same_model(strategy.server_params(server_state) or {}, new_params, name, updates.round)
    bad = nonfinite_keys(new_params)
    if bad:
        hint = strategy.nonfinite_hint() or (
            f"the step is too large for them. Lower server_lr (now {strategy.server_lr:g}) or use a bounded "
            "server optimizer."
        )
        raise FloatingPointError(
            f"Round {updates.round}: every client update was finite, but the server step of {name} made the "
            f"global parameters {bad[:3]} NaN/Inf: {hint}"
        )
    diag = {k: (v.detach().cpu() if isinstance(v, Tensor) else v) for k, v in diag.items()}
    if conflicts and strategy.needs.server_model == "one":
        params = strategy.server_params(server_state)
        diag.update(
            count_conflicts(updates.deltas, {k: new_params[k] - params[k] for k in params}, check=not updates.checked)
        )
    return new_state, diag


def _check_same_model(old: Params, new: Params, name: str, t: int) -> None:
    """The server step must return every parameter, each of its shape (a clear error, not a KeyError later)."""
    missing, unknown = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if missing or unknown:
        raise ValueError(
            f"Round {t}: {name}'s aggregate returned a server model with other parameters than the model's "
            f"(missing {missing[:5]}, unknown {unknown[:5]}): it must return every parameter."
        )
    for k, v in old.items():
        if tuple(new[k].shape) != tuple(v.shape):
            raise ValueError(
                f"Round {t}: {name}'s aggregate changed the shape of {k!r} from {tuple(v.shape)} to "
                f"{tuple(new[k].shape)}."
            )


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, leave=False)


def simulate(
    federation: Federation,
    model: nn.Module,
    strategy: Strategy,
    *,
    rounds: int = 30,
    clients_per_round: int = 10,
    local_epochs: int = 1,
    batch_size: int = 10,
    lr: float = 0.05,
    lr_decay: float = 1.0,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    eval_every: int = 1,
    seed: int = 0,
    device: str | torch.device = "auto",
    engine="auto",
    progress: bool = True,
    on_nonfinite: str = "raise",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    diagnostics: Sequence[str] = (),
    attack: Attack | None = None,
    secure_aggregation: bool = False,
) -> History:
    """Run federated training with any strategy and record per-client accuracy.

    Args:
        federation: the clients (see :func:`fedlearn_edu.data.federated_dataset`).
        model: the architecture and the initial global parameters theta_0. Not modified and
            not moved: the run works on a copy on ``device``.
        strategy: the method (e.g. ``FedAvg()``, ``FedAdam()``, ``Ditto(0.1)``, ``IFCA(4)``); it
            holds no run state (its ``init_state`` starts the server and client state), so one
            object can run several simulations.
        rounds: number of communication rounds T.
        clients_per_round: m, clients sampled uniformly without replacement each round
            (capped at the number of clients).
        local_epochs: the clients' local epochs per round, at most ``MAX_EPOCHS`` (100000; see
            :class:`fedlearn_edu.engine.LocalTraining`).
        batch_size: the clients' mini-batch size (one larger than a client's data: one full batch).
        lr: the clients' learning rate (of round 1); a number of the model's dtype.
        momentum: the clients' SGD momentum.
        weight_decay: the clients' weight decay.
        lr_decay: the client learning rate in round t is ``lr * lr_decay**(t-1)``.
        eval_every: evaluate every k rounds (round 0 and the last round always).
        seed: one seed for client sampling and local batch orders: same seed, same History.
        device: ``"auto"`` (CUDA, then MPS, then CPU), or any torch device.
        engine: ``"loop"`` (reference), ``"vmap"``/``"auto"`` when available, or an engine object.
            Global state: on the CPU the vectorised engine calls
            :func:`~fedlearn_edu.utils.tune_cpu_allocator` on first use, which changes glibc's
            allocator for the whole process and is never reverted (freed memory is kept for
            reuse; measured 1.5x faster rounds). Pass ``engine=VmapEngine(tune_allocator=False)``
            (or ``"loop"``) to leave the allocator alone.
        progress: ``True``/``False``: show a progress bar (notebook-aware).
        on_nonfinite: a client whose update (or new client state) holds NaN/Inf:
            ``"raise"`` stops the run with the cause; ``"skip"`` drops the client for the
            round (the others are aggregated, the global model never sees the bad update,
            ``History.dropped`` says who and why; a round where every client is dropped
            is skipped with a warning). A client is also dropped when a per-client signal it
            reports (e.g. FedOUI's OUI, DAC's scores) is NaN/Inf. Every strategy then runs as if
            the dropped client had not been selected that round: its client state is kept, it
            is left out of the server step (AFL's ``N/m`` uses the m' survivors). Errors name
            clients by their ids. The policy (:func:`fedlearn_edu.round.bad_clients`) is the
            Flower adapter's too.
        checkpoint: a file to save the run to (the strategy's server state -- parameters,
            optimizer moments, its own tensors --, client state, the sampler's RNG state, History
            so far), written atomically (a temporary file, then ``os.replace``; temporaries a
            killed save left are removed on the next save or resume). A ``str`` or
            ``os.PathLike`` in an existing folder where a file can be created, checked before
            round 1 (a save that fails later raises ``OSError`` naming the file). It holds a
            SHA-256 fingerprint of every tensor that affects the run (each client's training
            and test split, the strategy's tensors such as FedVG's validation set, the initial
            model), so a resume on other data is refused (see :mod:`fedlearn_edu.checkpoint`).
        checkpoint_every: save every k rounds (and after the last round).
        resume: ``True``/``False``: continue from ``checkpoint`` when the file exists (start afresh when it does
            not). The result is bit-identical to the uninterrupted run. A checkpoint written by
            another configuration, or by an older version of the package, is refused (naming
            the first setting or data tensor that differs, or telling to delete the file); an
            empty, truncated, corrupt or foreign file, or one whose states do not fit the run
            (an edited file: another shape or dtype, NaN parameters), gives one ``ValueError``
            saying so.
        diagnostics: optional per-round diagnostics to record in ``History.diagnostics``, from
            ``DIAGNOSTICS``: ``("conflicts",)`` counts, every round, the selected clients whose
            update conflicts with the applied one (``History.conflicts``). Added to those the
            strategy asks for itself (``Strategy.diagnostics``); ``History.config["diagnostics"]``
            says which were recorded.
        attack: an :class:`~fedlearn_edu.attacks.Attack`: its clients (chosen by its seed,
            ``History.attackers``) train on reversed labels (``"label_flip"``) or send the
            attack's update in place of theirs (the update-level kinds, applied to the round's
            stacked updates before the NaN check and aggregation). ``None``: every client is honest.
        secure_aggregation: ``True``/``False``: the server may see only sums of the clients' vectors
            (:mod:`fedlearn_edu.secagg`): a strategy whose server step reads each client's update
            or signal (``strategy.needs.sums_only`` false: FedVG, CRAFT, FedOUI, the robust rules,
            ...) is refused, saying what it would need. The sums themselves are computed in the
            clear (secure aggregation would give the same sums, up to its fixed-point rounding).

    Returns:
        :class:`History`.

    Example:
        >>> from fedlearn_edu import federated_dataset, make_model, FedAvg
        >>> fed = federated_dataset("digits", num_clients=10, alpha=0.5)
        >>> model = make_model("mlp", fed.input_shape, fed.num_classes)
        >>> h = simulate(fed, model, FedAvg(), rounds=2, clients_per_round=5, progress=False)
        >>> h.client_accuracy.shape
        (3, 10)
    """
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a fedlearn_edu Strategy (e.g. FedAvg()), got {type(strategy).__name__}.")
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (e.g. make_model('mlp', ...)), got {type(model).__name__}: {model!r}."
        )
    check_run_arguments(
        federation, rounds, clients_per_round, eval_every, lr_decay, model=model, seed=seed, strategy=strategy
    )
    progress = check_bool(progress, "progress")
    secure_aggregation = check_bool(secure_aggregation, "secure_aggregation")
    if on_nonfinite not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}.")
    checkpoint = _ckpt.check_checkpoint_args(checkpoint, resume, checkpoint_every)
    wanted = _diagnostics(diagnostics, strategy)
    attackers = _check_attack(attack, strategy, len(federation))
    if secure_aggregation:
        check_secure_aggregation(strategy)
    if attack is not None and attack.data_level:
        federation = reverse_labels(federation, attackers.tolist())
    base_config, lr_decay = local_training(local_epochs, batch_size, lr, lr_decay, momentum, weight_decay)
    dev = resolve_device(device)
    net = copy.deepcopy(model).to(dev)  # the caller's model is neither moved nor modified
    runner = make_engine(engine, net)
    num_clients = len(federation)
    m = min(int(clients_per_round), num_clients)
    name = getattr(strategy, "name", type(strategy).__name__)

    params0 = {k: v.to(dev) for k, v in get_params(net).items()}
    _check_lr_fits(base_config.lr, params0)
    train_sets = [(c.train_x.to(dev), c.train_y.to(dev)) for c in federation]
    bad_data = {i for i, (x, _) in enumerate(train_sets) if x.is_floating_point() and not bool(torch.isfinite(x).all())}
    num_samples = federation.num_train_samples
    test = _TestSet(federation, dev)
    sampler = torch.Generator().manual_seed(derive_seed(seed, 0xC11E47))
    server_state, client_state = strategy.init_state(params0, net, num_clients, seed)
    server_state = _to(server_state, dev)  # all of it on the run's device, as after a resume
    engine_name = getattr(runner, "name", type(runner).__name__)
    config = dict(
        rounds=rounds,
        clients_per_round=m,
        num_clients=num_clients,
        local=base_config,
        lr_decay=lr_decay,
        eval_every=eval_every,
        seed=seed,
        device=str(dev),
        engine=engine_name,
        strategy=repr(strategy),
        diagnostics=wanted,
    )
    if attack is not None:
        config["attack"] = attack.describe()
    if secure_aggregation:
        config["secure_aggregation"] = True
    settings = None if checkpoint is None else _ckpt.run_settings(config, federation, net, strategy)
    history = History(strategy=name, config=config, evaluated=strategy.evaluates)
    attacked = None if attack is None else attackers.numpy()
    history.attackers = attacked
    first = 1
    previous = None  # theta_{t-1}, for an attack that sends the last global update (stale free-riders)
    if resume and os.path.exists(checkpoint):
        saved = _ckpt.load(checkpoint, settings)
        _ckpt.check_states(checkpoint, saved, server_state, client_state, strategy.server_params(server_state))
        if saved["round"] > rounds:
            raise ValueError(f"The checkpoint {checkpoint!r} is at round {saved['round']}, past rounds={rounds}.")
        server_state = _to(saved["server_state"], dev)
        client_state = _to(saved["client_state"], dev)
        sampler.set_state(saved["sampler"])
        history = History.from_state(saved["history"], config)
        history.attackers = attacked
        if attack is not None and attack.needs_previous:
            previous = _to(saved.get("attack_state", {}).get("previous"), dev)
        first = saved["round"] + 1
        if history.eval_rounds[-1] % eval_every and first <= rounds:
            _drop_last_evaluation(history)  # the earlier run's final evaluation, off this run's grid

    def record(t: int) -> None:
        models = strategy.eval_models(net, server_state, client_state, train_sets)
        for i, (label, (p, which)) in enumerate(models.items()):
            acc, loss = evaluate_clients(net, p, federation, which=which, _test=test)
            if i == 0:
                history.client_accuracy = _append_row(history.client_accuracy, acc)
                history.client_loss = _append_row(history.client_loss, loss)
                if which is not None:
                    history.model_index = _append_row(history.model_index, which.cpu().numpy())
            else:
                history.other_accuracy[label] = _append_row(history.other_accuracy.get(label), acc)
        history.eval_rounds.append(t)

    start = time.perf_counter()
    if first == 1:
        record(0)
    bar = _progress(range(first, rounds + 1), progress, name)
    for t in bar:
        ids = torch.randperm(num_clients, generator=sampler)[:m].sort().values
        config_t = round_config(strategy, base_config, lr_decay, t)
        work = ClientWork.for_round(t, ids, train_sets, config_t, net, runner, seed, num_samples)
        dev_ids = ids.to(dev)
        rows = select_rows(client_state, dev_ids)
        out = strategy.client_update(work, server_state, rows)
        if attack is not None and not attack.data_level:
            theta_t = strategy.server_params(server_state)
            out.deltas = attack.apply(out.deltas, ids, attackers, t, theta_t, strategy.server_lr, previous)
            if attack.needs_previous:
                previous = {k: v.detach().clone() for k, v in theta_t.items()}
        keep, dropped = bad_clients(ids, out.deltas, out.state, out.signals, bad_data=bad_data)
        if dropped and on_nonfinite == "raise":
            blown_up = _blown_up(strategy, server_state, params0)
            why = _nonfinite_message(t, dropped, work.config, blown_up, strategy.server_lr, strategy)
            raise FloatingPointError(why)
        # the policy has scanned the updates (the bad rows go next): the aggregators need not again
        updates = ClientUpdates(
            t, ids, out.deltas, num_samples[ids], out.train_loss, net, out.signals, work.config, checked=True
        )
        recorded = out.train_loss if out.recorded_loss is None else out.recorded_loss
        if dropped:
            updates = updates.subset(keep)
            recorded = recorded[keep.to(recorded.device)]
            out.state = select_rows(out.state, keep.to(dev))
            dev_ids = dev_ids[keep.to(dev)]
        history.selected.append(ids.numpy())
        history.dropped.append(dropped)
        if updates.num_clients == 0:
            warnings.warn(f"Round {t}: every selected client was dropped ({dropped}); the round is skipped.")
            history.train_loss.append(float("nan"))
            history.diagnostics.append({})
        else:
            server_state, diag = server_step(strategy, server_state, updates, name, conflicts="conflicts" in wanted)
            _write_rows(client_state, dev_ids, out.state)
            history.train_loss.append(float(recorded.mean()))
            history.diagnostics.append(diag)
        if t % eval_every == 0 or t == rounds:
            record(t)
            if progress and hasattr(bar, "set_postfix"):
                bar.set_postfix(mean_acc=f"{np.nanmean(history.client_accuracy[-1]):.3f}")
        if checkpoint is not None and (t % checkpoint_every == 0 or t == rounds):
            payload = {
                "version": CHECKPOINT_VERSION,
                "settings": settings,
                "round": t,
                "server_state": _to(_plain(server_state), "cpu"),
                "client_state": _to(client_state, "cpu"),
                "sampler": sampler.get_state(),
                "history": history.to_state(),
            }
            if previous is not None:  # an optional entry: the layout of every other run is unchanged
                payload["attack_state"] = {"previous": _to(previous, "cpu")}
            _ckpt.save(checkpoint, payload)
    history.seconds = time.perf_counter() - start
    final = strategy.server_params(server_state)
    history.final_params = None if final is None else {k: v.cpu() for k, v in final.items()}
    history.final_state = _to(client_state, "cpu")
    history.final_server_state = _to(server_state, "cpu")
    return history


def _check_lr_fits(lr: float, params: Params) -> None:
    """The client lr must be a number of the parameters' dtype (the engines' SGD step takes it as one)."""
    for p in params.values():
        if p.is_floating_point() and lr > torch.finfo(p.dtype).max:
            raise ValueError(
                f"lr={lr!r} is too large for {p.dtype} parameters (at most {torch.finfo(p.dtype).max:.3g})."
            )


def _check_attack(attack, strategy: Strategy, num_clients: int) -> Tensor | None:
    """The attackers' ids of ``attack`` (``None`` without one), after checking it fits the strategy."""
    if attack is None:
        return None
    if not isinstance(attack, Attack):
        raise TypeError(f"attack must be a fedlearn_edu.attacks.Attack (or None), got {type(attack).__name__}.")
    if attack.kind in ("model_replacement", "stale_free_rider") and strategy.needs.server_model != "one":
        what = "model-replacement" if attack.kind == "model_replacement" else "stale free-rider"
        raise ValueError(
            f"The {what} attack aims at one global model; {strategy.name} keeps "
            f"{'K cluster models' if strategy.needs.server_model == 'clusters' else 'none'}."
        )
    return attack.attackers(num_clients)


def _diagnostics(requested, strategy: Strategy) -> tuple[str, ...]:
    """The optional diagnostics a run records: the user's ``requested`` plus the strategy's own."""
    if isinstance(requested, str):
        requested = (requested,)
    try:
        names = set(requested) | set(getattr(strategy, "diagnostics", ()))
    except TypeError:
        raise TypeError(f"diagnostics must be a sequence of names from {DIAGNOSTICS}, got {requested!r}.") from None
    unknown = sorted(str(n) for n in names if n not in DIAGNOSTICS)
    if unknown:
        raise ValueError(f"Unknown diagnostics {unknown}; choose from {DIAGNOSTICS}.")
    return tuple(n for n in DIAGNOSTICS if n in names)


def _append_row(rows: np.ndarray | None, row: np.ndarray) -> np.ndarray:
    row = np.asarray(row)[None]
    return row if rows is None or rows.size == 0 else np.concatenate([rows, row])


def _drop_last_evaluation(history: History) -> None:
    history.eval_rounds.pop()
    history.client_accuracy = history.client_accuracy[:-1]
    history.client_loss = history.client_loss[:-1]
    if history.model_index is not None:
        history.model_index = history.model_index[:-1]
    history.other_accuracy = {k: v[:-1] for k, v in history.other_accuracy.items()}


def _write_rows(tree: dict, index: Tensor, rows: dict) -> None:
    """``tree[...][index] = rows[...]`` for every tensor of ``rows`` (in place)."""
    for k, v in rows.items():
        if isinstance(v, dict):
            _write_rows(tree[k], index, v)
        else:
            tree[k][index.to(tree[k].device)] = v.detach()


TINY_LR = 1e-12  # a client lr below this vanishes in float32 steps; SCAFFOLD's control update divides by it


def _blown_up(strategy: Strategy, server_state: dict, params0: Params) -> float | None:
    """``max |theta_t| / max |theta_0|`` when the server's model grew more than 1e4-fold (else ``None``)."""
    params = strategy.server_params(server_state) if strategy.needs.server_model == "one" else None
    if not params:
        return None
    now = max(float(v.detach().abs().max()) for v in params.values() if v.numel())
    start = max(float(v.detach().abs().max()) for v in params0.values() if v.numel())
    return now / max(start, 1e-12) if now > 1e4 * max(start, 1e-12) else None


def _nonfinite_message(
    t: int,
    dropped: dict,
    config: LocalTraining,
    blown_up: float | None = None,
    server_lr: float | None = None,
    strategy: Strategy | None = None,
) -> str:
    lr, mu = config.lr, config.prox_mu
    data = [i for i, why in dropped.items() if why == DATA_REASON]
    by_reason: dict[str, list] = {}  # the other clients, by the part that was bad (update first)
    for i, why in dropped.items():
        if why != DATA_REASON:
            by_reason.setdefault(why, []).append(i)
    parts = []
    if data:
        parts.append(f"the training data of client(s) {data[:5]} hold NaN/Inf values: clean the data")
    if by_reason:
        diverged = by_reason.pop(UPDATE_REASON, [])
        what = [f"local training of client(s) {diverged[:5]} diverged (NaN/Inf in the update)"] if diverged else []
        what += [f"client(s) {ids[:5]}: {why}" for why, ids in by_reason.items()]
        what = ", ".join(what)
        if blown_up is not None:
            fix = (
                f"the server step had already blown the global model up ({blown_up:.2g} times its initial size) "
                f"before local training: lower server_lr (now {server_lr:g})"
            )
        elif lr * mu > 2 and mu > 1:  # SGD on (mu/2)||w - theta_t||^2 multiplies w - theta_t by 1 - lr mu
            argument = getattr(strategy, "prox_argument", "")
            who = f"{type(strategy).__name__}'s {argument}" if argument else "prox_mu"
            fix = (
                f"lr * prox_mu = {lr:g} * {mu:g} = {lr * mu:.3g} is above 2, where local SGD on the proximal term "
                f"oscillates and grows: lower {who} (now {mu:g}) or the client lr"
            )
        elif lr < TINY_LR:
            fix = (
                f"the client lr (now {lr:g}) is too small: steps vanish in float32 and updates that divide by "
                "the step size (SCAFFOLD's control variates) overflow; raise it"
            )
        else:
            fix = f"lower the client lr (now {lr:g}) or the number of local epochs"
        parts.append(f"{what}: {fix}")
    return f"Round {t}: " + "; ".join(parts) + ", or pass on_nonfinite='skip' to drop such clients for the round."

"""The simulator: rounds, seeded client sampling, evaluation, History.

One round t:

1. sample ``clients_per_round`` clients without replacement (seeded);
2. the engine trains them all from theta_t (the strategy may change the local config);
3. clients compute their signals; the server receives ``Delta_i = theta_i - theta_t``;
4. the strategy aggregates into theta_{t+1};
5. every ``eval_every`` rounds the global model is evaluated on *every* client's
   local test split (per-client accuracy and loss).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from .aggregators import count_conflicts
from .checks import check_float, check_int, check_model_data, check_seed, check_trainable
from .data.federation import Federation
from .engine import LocalTraining, make_engine
from .metrics import METRIC_NAMES, fairness_metrics
from .params import Params, get_params
from .strategies.base import ClientUpdates, Strategy
from .utils import derive_seed, resolve_device

__all__ = ["simulate", "History", "evaluate_clients"]


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
            plus ``conflicts`` (clients whose update has a negative inner product with the
            applied update) and ``conflicts_per_layer``.
        config: the simulation's settings.
        seconds: wall-clock time of the run.
        final_params: the last global parameters (on the CPU).
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

    def metrics(self, index: int = -1) -> dict[str, float]:
        """Fairness metrics (mean, std, worst10, best10) at evaluation ``index`` (default: last)."""
        if len(self.eval_rounds) == 0:
            raise ValueError("This History holds no evaluation yet.")
        out = fairness_metrics(self.client_accuracy[index])
        return {"round": self.eval_rounds[index], **out}

    def curve(self, metric: str = "mean") -> np.ndarray:
        """``ndarray[E]``: a fairness metric at every evaluation round.

        Args:
            metric: one of ``"mean"``, ``"std"``, ``"worst10"``, ``"best10"``.
        """
        if metric not in METRIC_NAMES:
            raise ValueError(f"Unknown metric {metric!r}; choose one of {sorted(METRIC_NAMES)}.")
        return np.array([fairness_metrics(row)[metric] for row in self.client_accuracy])

    def best(self, metric: str = "mean") -> float:
        """Best value of ``metric`` over the evaluations (max; min for ``std``)."""
        c = self.curve(metric)
        return float(c.min() if metric == "std" else c.max())

    @property
    def conflicts(self) -> np.ndarray:
        """``ndarray[T]``: per round, how many selected clients conflict with the applied update."""
        return np.array([d["conflicts"] for d in self.diagnostics])

    def summary(self) -> str:
        """A text table of the fairness metrics at each evaluation (at most ~8 rows)."""
        return format_table({self.strategy: self}, every=True)


def format_table(histories: dict[str, History], every: bool = False) -> str:
    """Text table of fairness metrics; one row per strategy (final), or per evaluation with ``every``."""
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
    model: nn.Module, params: Params, federation: Federation, batch_size: int = 2048, _test: _TestSet | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean loss of one global model on every client's local test split.

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
    correct = torch.zeros(test.num_clients, dtype=torch.float64, device=device)
    loss = torch.zeros(test.num_clients, dtype=torch.float64, device=device)
    for start in range(0, test.y.shape[0], batch_size):
        sl = slice(start, start + batch_size)
        logits = functional_call(model, params, (test.x[sl],))
        owner = test.owner[sl]
        correct.index_add_(0, owner, (logits.argmax(1) == test.y[sl]).double())
        loss.index_add_(0, owner, F.cross_entropy(logits, test.y[sl], reduction="none").double())
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
            server validation set if it has one (FedVG).
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
    lr_decay = check_float(lr_decay, "lr_decay")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}.")
    check_seed(seed)
    if model is None:
        return
    check_trainable(model)
    data_name = federation.name or "federation"
    check_model_data(model, federation.input_shape, federation.num_classes, data_name, federation[0].train_x.dtype)
    val = getattr(strategy, "validation_data", None)
    if val is not None:
        x_val, y_val = val
        if tuple(x_val.shape[1:]) != tuple(federation.input_shape):
            raise ValueError(
                f"The server validation set of {type(strategy).__name__} has inputs of shape "
                f"{tuple(x_val.shape[1:])}, but data set {data_name!r} has {tuple(federation.input_shape)}."
            )
        if y_val.numel() and (int(y_val.min()) < 0 or int(y_val.max()) >= federation.num_classes):
            raise ValueError(
                f"The server validation set of {type(strategy).__name__} has labels outside "
                f"[0, {federation.num_classes - 1}] (data set {data_name!r})."
            )


def server_step(strategy: Strategy, params: Params, updates: ClientUpdates, name: str) -> tuple[Params, dict]:
    """One aggregation: ``strategy.aggregate`` plus the conflict counts of the applied update.

    Returns the new (detached) global parameters and the round's diagnostics; raises
    ``FloatingPointError`` with advice when the global parameters become NaN/Inf.
    """
    new_params, diag = strategy.aggregate(params, updates)
    new_params = {k: v.detach() for k, v in new_params.items()}
    bad = [k for k, v in new_params.items() if not bool(torch.isfinite(v).all())]
    if bad:
        raise FloatingPointError(
            f"Round {updates.round}: the global parameters {bad[:3]} became NaN/Inf under "
            f"{name}. Lower the client lr or server_lr."
        )
    applied = {k: new_params[k] - params[k] for k in params}
    diag = {
        **{k: (v.detach().cpu() if isinstance(v, Tensor) else v) for k, v in diag.items()},
        **count_conflicts(updates.deltas, applied),
    }
    return new_params, diag


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
) -> History:
    """Run federated training and record per-client accuracy of the global model.

    Args:
        federation: the clients (see :func:`fedlearn_edu.data.federated_dataset`).
        model: the architecture and the initial global parameters theta_0 (not modified).
        strategy: the server strategy (e.g. ``FedAvg()``); its state is reset first.
        rounds: number of communication rounds T.
        clients_per_round: m, clients sampled uniformly without replacement each round
            (capped at the number of clients).
        local_epochs, batch_size, lr, momentum, weight_decay: clients' local SGD
            (see :class:`fedlearn_edu.engine.LocalTraining`).
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
        progress: show a progress bar (notebook-aware).

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
    check_run_arguments(
        federation, rounds, clients_per_round, eval_every, lr_decay, model=model, seed=seed, strategy=strategy
    )
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a fedlearn_edu Strategy (e.g. FedAvg()), got {type(strategy).__name__}.")
    base_config = LocalTraining(local_epochs, batch_size, lr, momentum, weight_decay)
    dev = resolve_device(device)
    runner = make_engine(engine, model)
    num_clients = len(federation)
    m = min(int(clients_per_round), num_clients)

    model = model.to(dev)
    params = {k: v.to(dev) for k, v in get_params(model).items()}
    train_sets = [(c.train_x.to(dev), c.train_y.to(dev)) for c in federation]
    num_samples = federation.num_train_samples
    test = _TestSet(federation, dev)
    sampler = torch.Generator().manual_seed(derive_seed(seed, 0xC11E47))
    strategy.init(params)

    history = History(
        strategy=getattr(strategy, "name", type(strategy).__name__),
        config=dict(
            rounds=rounds,
            clients_per_round=m,
            num_clients=num_clients,
            local=base_config,
            lr_decay=lr_decay,
            eval_every=eval_every,
            seed=seed,
            device=str(dev),
            engine=getattr(runner, "name", type(runner).__name__),
            strategy=repr(strategy),
        ),
    )
    accs, losses = [], []

    def record(t: int) -> None:
        acc, loss = evaluate_clients(model, params, federation, _test=test)
        history.eval_rounds.append(t)
        accs.append(acc)
        losses.append(loss)

    start = time.perf_counter()
    record(0)
    bar = _progress(range(1, rounds + 1), progress, f"{history.strategy}")
    for t in bar:
        ids = torch.randperm(num_clients, generator=sampler)[:m].sort().values
        config = strategy.configure_local(base_config.replace(lr=lr * lr_decay ** (t - 1)))
        datasets = [train_sets[i] for i in ids.tolist()]
        seeds = [derive_seed(seed, t, i) for i in ids.tolist()]
        local = runner.train(model, params, datasets, config, seeds)
        signals = strategy.client_signals(model, params, local, datasets)
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        finite = torch.stack([torch.isfinite(v.reshape(len(ids), -1)).all(1) for v in deltas.values()]).all(0)
        if not bool(finite.all()):
            bad_ids = ids[~finite.cpu()].tolist()
            raise FloatingPointError(
                f"Round {t}: local training of client(s) {bad_ids[:5]} diverged (NaN/Inf in the update). "
                f"Lower the client lr (now {config.lr:g}) or the number of local epochs."
            )
        updates = ClientUpdates(t, ids, deltas, num_samples[ids], local.train_loss, model, signals)
        params, diag = server_step(strategy, params, updates, history.strategy)
        history.selected.append(ids.numpy())
        history.train_loss.append(float(local.train_loss.mean()))
        history.diagnostics.append(diag)
        if t % eval_every == 0 or t == rounds:
            record(t)
            if progress and hasattr(bar, "set_postfix"):
                bar.set_postfix(mean_acc=f"{np.nanmean(accs[-1]):.3f}")
    history.seconds = time.perf_counter() - start
    history.client_accuracy = np.stack(accs)
    history.client_loss = np.stack(losses)
    history.final_params = {k: v.cpu() for k, v in params.items()}
    return history

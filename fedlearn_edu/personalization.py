"""Baselines that keep more than one model: local-only training, IFCA and Ditto.

They do not fit :func:`~fedlearn_edu.simulate`'s single-global-model loop, so
each has its own small simulation function here. All three reuse the same
pieces as the simulator -- the same seeded client sampling, the same
per-client batch orders (:func:`~fedlearn_edu.engine.client_batches` seeded by
``derive_seed(seed, t, i)``), the engines' loss and SGD step -- and return a
:class:`PersonalizedHistory`, a :class:`~fedlearn_edu.History` whose
``client_accuracy[e, i]`` is the accuracy of the model *client i would use*
(its own, its cluster's, or its personal model) on client i's local test
split, so the numbers sit in one table with FedAvg's.

======================  ==========================================================
:func:`simulate_local`  every client trains its own model; nothing is shared
:func:`simulate_ifca`   K cluster models; each client trains the one with the
                        lowest loss on its data; the server averages per cluster
                        (Ghosh et al., 2020)
:func:`simulate_ditto`  a global model trained by any server strategy (FedAvg by
                        default) plus a personal model per client pulled towards
                        it: ``v <- v - lr (grad F_i(v) + lam (v - theta_t))``
                        (Li et al., 2021)
======================  ==========================================================

:func:`train_clients` is the engine call these need and the engines lack:
local SGD for m clients from *m different* starting points (the engines start
every client from one ``global_params``), with an optional proximal anchor.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from .aggregators import fedavg
from .data.federation import Federation
from .engine import LocalResult, LocalTraining, LoopEngine, VmapEngine, make_engine
from .params import Params, get_params, stack_params
from .simulation import History, check_run_arguments, evaluate_clients, server_step
from .strategies.base import ClientUpdates, Strategy
from .strategies.fedavg import FedAvg
from .utils import derive_seed, resolve_device

__all__ = [
    "PersonalizedHistory",
    "train_clients",
    "evaluate_personal",
    "client_losses",
    "ditto_personal_update",
    "simulate_local",
    "simulate_ifca",
    "simulate_ditto",
]


@dataclass
class PersonalizedHistory(History):
    """A :class:`~fedlearn_edu.History` for methods with several models.

    ``client_accuracy[e, i]`` / ``client_loss[e, i]``: the model client i uses at evaluation e
    (local: its own; IFCA: the cluster model with the lowest training loss on its data;
    Ditto: its personal model) on client i's local test split.

    Attributes:
        personal_params: ``{name: Tensor[N, ...]}`` the final model of every client
            (local-only and Ditto; for IFCA the cluster model each client picked).
        cluster_params: IFCA only: ``{name: Tensor[K, ...]}`` the final cluster models.
        assignments: IFCA only: ``ndarray[E, N]`` the cluster every client picked at each
            evaluation.
        global_client_accuracy: Ditto only: ``ndarray[E, N]`` accuracy of the *global* model.
    """

    personal_params: Params | None = None
    cluster_params: Params | None = None
    assignments: np.ndarray | None = None
    global_client_accuracy: np.ndarray | None = None


# --------------------------------------------------------------------------- #
# local training from per-client starting points
# --------------------------------------------------------------------------- #
def train_clients(
    model: nn.Module,
    start: Params,
    datasets: Sequence[tuple[Tensor, Tensor]],
    config: LocalTraining,
    seeds: Sequence[int],
    *,
    anchor: Params | None = None,
    engine="auto",
) -> LocalResult:
    """Local SGD for m clients, client j starting from its own ``start[k][j]``.

    Every client runs exactly what the engines run (same batches from
    :func:`~fedlearn_edu.engine.client_batches`, same step), only the starting point
    differs; with all rows of ``start`` equal to ``anchor`` the result equals
    ``make_engine(engine).train(model, anchor, datasets, config, seeds)``.

    Args:
        model: the architecture (used through ``functional_call``).
        start: stacked starting parameters ``{name: Tensor[m, ...]}``.
        datasets: per client ``(x, y)`` on the model's device.
        config: local hyper-parameters; ``config.prox_mu > 0`` adds
            ``(prox_mu / 2) ||w - anchor||^2`` to the loss (Ditto's personal objective).
        seeds: per-client batch-order seeds.
        anchor: the proximal centre ``{name: Tensor}`` (one for all clients), needed when
            ``config.prox_mu > 0``.
        engine: ``"auto"``, ``"loop"`` or ``"vmap"`` (or an instance of those engines).

    Returns:
        :class:`~fedlearn_edu.engine.LocalResult` with the stacked trained parameters.
    """
    if config.prox_mu and anchor is None:
        raise ValueError("config.prox_mu > 0 needs an anchor (the proximal centre).")
    if anchor is None:  # no proximal term: the centre is never used
        anchor = {k: torch.zeros_like(v[0]) for k, v in start.items()}
    runner = make_engine(engine, model)
    if not isinstance(runner, (LoopEngine, VmapEngine)):
        raise TypeError(
            "train_clients supports the package engines ('auto', 'loop', 'vmap' or their "
            f"instances); got {type(runner).__name__}."
        )
    return runner.train(model, {k: v.detach() for k, v in anchor.items()}, datasets, config, seeds, start=start)


# --------------------------------------------------------------------------- #
# evaluation of one model per client
# --------------------------------------------------------------------------- #
@torch.no_grad()
def evaluate_personal(
    model: nn.Module, params: Params, federation: Federation, split: str = "test"
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean loss of client i's own model ``{k: params[k][i]}`` on client i's data.

    Args:
        params: stacked ``{name: Tensor[N, ...]}``, one model per client.
        split: ``"test"`` (local test split, the default) or ``"train"``.

    Returns:
        ``(accuracy: ndarray[N], loss: ndarray[N])``; NaN for a client without samples.
    """
    n = len(federation)
    if any(v.shape[0] != n for v in params.values()):
        raise ValueError(f"params must hold one model per client (N = {n}) on the leading axis.")
    device = next(iter(params.values())).device
    acc, loss = np.full(n, np.nan), np.full(n, np.nan)
    for i, c in enumerate(federation):
        x, y = (c.test_x, c.test_y) if split == "test" else (c.train_x, c.train_y)
        if y.numel() == 0:
            continue
        logits = functional_call(model, {k: v[i] for k, v in params.items()}, (x.to(device),))
        y = y.to(device)
        acc[i] = float((logits.argmax(1) == y).double().mean())
        loss[i] = float(F.cross_entropy(logits, y).double())
    return acc, loss


@torch.no_grad()
def client_losses(model: nn.Module, models: Params, datasets: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """``Tensor[m, K]``: mean cross-entropy of each of K stacked models on each client's data.

    IFCA's cluster identity estimate is the row-wise argmin.
    """
    k = next(iter(models.values())).shape[0]
    out = torch.empty(len(datasets), k, dtype=torch.float64)
    for j in range(k):
        p = {name: v[j] for name, v in models.items()}
        for i, (x, y) in enumerate(datasets):
            out[i, j] = float(F.cross_entropy(functional_call(model, p, (x,)), y))
    return out


# --------------------------------------------------------------------------- #
# shared simulation scaffolding
# --------------------------------------------------------------------------- #
class _Run:
    """Sampling, seeds, devices and recording shared by the three simulations (as in ``simulate``)."""

    def __init__(
        self,
        name,
        federation,
        model,
        rounds,
        clients_per_round,
        local_epochs,
        batch_size,
        lr,
        lr_decay,
        momentum,
        weight_decay,
        eval_every,
        seed,
        device,
        engine,
        extra,
    ):
        check_run_arguments(federation, rounds, clients_per_round, eval_every, lr_decay, model=model, seed=seed)
        self.base = LocalTraining(local_epochs, batch_size, lr, momentum, weight_decay)
        self.dev = resolve_device(device)
        self.engine = engine
        self.kind = make_engine(engine, model).name
        self.n = len(federation)
        self.m = min(int(clients_per_round), self.n)
        self.model = model.to(self.dev)
        self.params = {k: v.to(self.dev) for k, v in get_params(self.model).items()}
        self.train_sets = [(c.train_x.to(self.dev), c.train_y.to(self.dev)) for c in federation]
        self.num_samples = federation.num_train_samples
        self.fed_dev = federation.to(self.dev)
        self.sampler = torch.Generator().manual_seed(derive_seed(seed, 0xC11E47))
        self.seed, self.rounds, self.lr, self.lr_decay, self.eval_every = seed, rounds, lr, lr_decay, eval_every
        self.history = PersonalizedHistory(
            strategy=name,
            config=dict(
                rounds=rounds,
                clients_per_round=self.m,
                num_clients=self.n,
                local=self.base,
                lr_decay=lr_decay,
                eval_every=eval_every,
                seed=seed,
                device=str(self.dev),
                engine=self.kind,
                **extra,
            ),
        )
        self.accs, self.losses = [], []
        self.start = time.perf_counter()

    def select(self, t: int) -> tuple[Tensor, LocalTraining, list, list]:
        ids = torch.randperm(self.n, generator=self.sampler)[: self.m].sort().values
        config = self.base.replace(lr=self.lr * self.lr_decay ** (t - 1))
        datasets = [self.train_sets[i] for i in ids.tolist()]
        seeds = [derive_seed(self.seed, t, i) for i in ids.tolist()]
        return ids, config, datasets, seeds

    def record(self, t: int, acc, loss) -> None:
        self.history.eval_rounds.append(t)
        self.accs.append(acc)
        self.losses.append(loss)

    def due(self, t: int) -> bool:
        return t % self.eval_every == 0 or t == self.rounds

    def finish(self) -> PersonalizedHistory:
        h = self.history
        h.seconds = time.perf_counter() - self.start
        h.client_accuracy = np.stack(self.accs)
        h.client_loss = np.stack(self.losses)
        return h


def _check_finite(t: int, ids: Tensor, params: Params, what: str) -> None:
    m = ids.shape[0]
    finite = torch.stack([torch.isfinite(v.reshape(m, -1)).all(1) for v in params.values()]).all(0)
    if not bool(finite.all()):
        bad = ids[~finite.cpu()].tolist()
        raise FloatingPointError(
            f"Round {t}: {what} of client(s) {bad[:5]} diverged (NaN/Inf). "
            "Lower the client lr or the number of local epochs."
        )


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, leave=False)


def _repeat(params: Params, n: int) -> Params:
    return {k: v.detach().unsqueeze(0).repeat(n, *([1] * v.dim())).clone() for k, v in params.items()}


# --------------------------------------------------------------------------- #
# local-only
# --------------------------------------------------------------------------- #
def simulate_local(
    federation: Federation,
    model: nn.Module,
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
    device="auto",
    engine="auto",
    progress: bool = True,
) -> PersonalizedHistory:
    """Local-only training: every client starts from theta_0 and trains only on its own data.

    Rounds, sampling and local steps are those of :func:`~fedlearn_edu.simulate` (a client
    trains ``local_epochs`` epochs whenever it is selected), but nothing is averaged: the
    lower bound on what collaboration must beat, and the upper bound when clients have
    plenty of data and conflicting tasks.

    Example:
        >>> from fedlearn_edu import federated_dataset, make_model
        >>> fed = federated_dataset("digits", num_clients=4, alpha=1.0)
        >>> h = simulate_local(fed, make_model("mlp", fed.input_shape, 10), rounds=1, progress=False)
        >>> h.client_accuracy.shape
        (2, 4)
    """
    run = _Run(
        "local",
        federation,
        model,
        rounds,
        clients_per_round,
        local_epochs,
        batch_size,
        lr,
        lr_decay,
        momentum,
        weight_decay,
        eval_every,
        seed,
        device,
        engine,
        {},
    )
    personal = _repeat(run.params, run.n)
    run.record(0, *evaluate_personal(run.model, personal, run.fed_dev))
    for t in _progress(range(1, rounds + 1), progress, "local"):
        ids, config, datasets, seeds = run.select(t)
        local = train_clients(
            run.model, {k: v[ids.to(v.device)] for k, v in personal.items()}, datasets, config, seeds, engine=engine
        )
        _check_finite(t, ids, local.params, "local training")
        for k in personal:
            personal[k][ids.to(personal[k].device)] = local.params[k].detach()
        run.history.selected.append(ids.numpy())
        run.history.train_loss.append(float(local.train_loss.mean()))
        run.history.diagnostics.append({})
        if run.due(t):
            run.record(t, *evaluate_personal(run.model, personal, run.fed_dev))
    h = run.finish()
    h.personal_params = {k: v.cpu() for k, v in personal.items()}
    return h


# --------------------------------------------------------------------------- #
# IFCA
# --------------------------------------------------------------------------- #
def _reinit(model: nn.Module, seed: int) -> Params:
    """Parameters of a fresh initialisation of ``model``'s architecture, seeded."""
    clone = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mod in clone.modules():
            if hasattr(mod, "reset_parameters") and mod is not clone:
                mod.reset_parameters()
    return get_params(clone)


def simulate_ifca(
    federation: Federation,
    model: nn.Module,
    num_clusters: int,
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
    device="auto",
    engine="auto",
    progress: bool = True,
    warmup_rounds: int = 0,
) -> PersonalizedHistory:
    """IFCA (Ghosh et al., 2020), model-averaging variant.

    The server keeps K cluster models theta^1..theta^K (cluster 1 starts from ``model``'s
    parameters, the others from fresh seeded initialisations). Each round every selected
    client i

    1. estimates its cluster: ``j_i = argmin_j F_i(theta^j)`` (mean training loss);
    2. trains theta^{j_i} locally and sends ``Delta_i`` with ``j_i``;

    and the server averages per cluster, ``theta^j += sum_{i: j_i = j} p_i Delta_i`` with
    ``p_i`` proportional to n_i within the cluster (a cluster nobody picked stays). At
    evaluation every client uses the cluster model with its lowest training loss.

    Warm-up (**ours**, off by default): for ``warmup_rounds`` rounds the selected clients
    are dealt to the K clusters at random, in equal numbers, instead of by the argmin. From
    random initial models the argmin can send *every* client to the same model in round 1
    (one random model happens to fit all clients slightly better); that model then improves
    for everyone and the other K - 1 are never picked again. The IFCA paper counters this
    with several random restarts; one warm-up round is a cheaper remedy.
    ``warmup_rounds=0`` is the plain algorithm.

    Args:
        num_clusters: K.
        warmup_rounds: rounds of random balanced assignment before the argmin takes over.
        **kwargs: the other arguments are those of :func:`~fedlearn_edu.simulate`.

    Returns:
        :class:`PersonalizedHistory` with ``assignments`` (``ndarray[E, N]``) and
        ``cluster_params``; ``diagnostics[t]["assignment"]`` holds the selected clients' picks.
    """
    k = int(num_clusters)
    if k < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}.")
    if int(warmup_rounds) != warmup_rounds or warmup_rounds < 0:
        raise ValueError(f"warmup_rounds must be an integer >= 0, got {warmup_rounds}.")
    run = _Run(
        "ifca",
        federation,
        model,
        rounds,
        clients_per_round,
        local_epochs,
        batch_size,
        lr,
        lr_decay,
        momentum,
        weight_decay,
        eval_every,
        seed,
        device,
        engine,
        {"num_clusters": k, "warmup_rounds": int(warmup_rounds)},
    )
    clusters = stack_params(
        [run.params]
        + [{n: v.to(run.dev) for n, v in _reinit(run.model, derive_seed(seed, 0x1FCA, j)).items()} for j in range(1, k)]
    )
    assignments = []

    def evaluate():
        assign = client_losses(run.model, clusters, run.train_sets).argmin(1)
        per_client = {n: v[assign.to(v.device)] for n, v in clusters.items()}
        assignments.append(assign.numpy())
        return evaluate_personal(run.model, per_client, run.fed_dev)

    run.record(0, *evaluate())
    for t in _progress(range(1, rounds + 1), progress, "ifca"):
        ids, config, datasets, seeds = run.select(t)
        if t <= warmup_rounds:
            g = torch.Generator().manual_seed(derive_seed(seed, t, 0x1FCA))
            assign = (torch.randperm(len(ids), generator=g) % k).to(run.dev)
        else:
            assign = client_losses(run.model, clusters, datasets).argmin(1).to(run.dev)
        start = {n: v[assign] for n, v in clusters.items()}
        local = train_clients(run.model, start, datasets, config, seeds, engine=engine)
        _check_finite(t, ids, local.params, "local training")
        deltas = {n: local.params[n] - start[n] for n in start}
        sizes = run.num_samples[ids].to(run.dev, torch.float64)
        new = {n: v.clone() for n, v in clusters.items()}
        counts = torch.bincount(assign, minlength=k)
        for j in range(k):
            members = (assign == j).nonzero().flatten()
            if members.numel() == 0:
                continue
            step = fedavg({n: d[members] for n, d in deltas.items()}, sizes[members])
            for n in new:
                new[n][j] = clusters[n][j] + step[n]
        clusters = {n: v.detach() for n, v in new.items()}
        run.history.selected.append(ids.numpy())
        run.history.train_loss.append(float(local.train_loss.mean()))
        run.history.diagnostics.append({"assignment": assign.cpu(), "cluster_sizes": counts.cpu()})
        if run.due(t):
            run.record(t, *evaluate())
    h = run.finish()
    h.assignments = np.stack(assignments)
    h.cluster_params = {n: v.cpu() for n, v in clusters.items()}
    last = torch.as_tensor(assignments[-1])
    h.personal_params = {n: v.cpu()[last] for n, v in clusters.items()}
    h.final_params = {n: v[0] for n, v in h.cluster_params.items()}
    return h


# --------------------------------------------------------------------------- #
# Ditto
# --------------------------------------------------------------------------- #
def ditto_personal_update(
    model: nn.Module,
    personal: Params,
    global_params: Params,
    datasets: Sequence[tuple[Tensor, Tensor]],
    config: LocalTraining,
    lam: float,
    seeds: Sequence[int],
    *,
    engine="auto",
) -> LocalResult:
    """Ditto's personal step for m clients: local SGD on ``F_i(v) + (lam / 2) ||v - theta_t||^2``.

    One step on a batch b is

        v <- v - lr * ( grad F_i(v; b) + lam * (v - theta_t) )

    (plus the configured momentum / weight decay, as for any local training), starting from
    each client's current personal model ``personal[k][i]``; ``theta_t`` is the global model
    the client received this round.

    Args:
        personal: stacked ``{name: Tensor[m, ...]}``, the selected clients' personal models v_i.
        global_params: theta_t.
        lam: Ditto's lambda >= 0 (``lam = 0``: local training; large: the global model).
        model, datasets, config, seeds, engine: as in :func:`train_clients`.
    """
    if not (lam >= 0 and lam < float("inf")):
        raise ValueError(f"Ditto's lam must be a finite number >= 0, got {lam}.")
    return train_clients(
        model, personal, datasets, config.replace(prox_mu=float(lam)), seeds, anchor=global_params, engine=engine
    )


def simulate_ditto(
    federation: Federation,
    model: nn.Module,
    lam: float = 0.1,
    global_strategy: Strategy | None = None,
    *,
    rounds: int = 30,
    clients_per_round: int = 10,
    local_epochs: int = 1,
    personal_epochs: int | None = None,
    batch_size: int = 10,
    lr: float = 0.05,
    lr_decay: float = 1.0,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    eval_every: int = 1,
    seed: int = 0,
    device="auto",
    engine="auto",
    progress: bool = True,
) -> PersonalizedHistory:
    """Ditto (Li et al., 2021): a global model plus one personal model per client.

    Each round every selected client i

    1. trains the global model theta_t as usual and sends ``Delta_i`` (the global part);
    2. updates its personal model v_i for ``personal_epochs`` epochs with
       :func:`ditto_personal_update` (anchored at theta_t, strength ``lam``); v_i never
       leaves the client.

    The server turns the ``Delta_i`` into theta_{t+1} with ``global_strategy`` -- any
    :class:`~fedlearn_edu.Strategy` (FedAvg by default). This is the hook for "Ditto +
    CRAFT": pass CRAFT's strategy here. Personal models start at theta_0.

    Args:
        lam: Ditto's lambda (0.1 by default; the paper tunes it in {0.05, ..., 2}).
        global_strategy: the server strategy of the global model (default ``FedAvg()``).
        personal_epochs: epochs of the personal update (default: ``local_epochs``).
        **kwargs: the other arguments are those of :func:`~fedlearn_edu.simulate`.

    Returns:
        :class:`PersonalizedHistory`: ``client_accuracy`` of the personal models,
        ``global_client_accuracy`` of the global model, ``final_params`` the global model,
        ``personal_params`` the personal ones; ``diagnostics`` as in ``simulate``
        (the global strategy's own plus ``conflicts``).
    """
    strategy = FedAvg() if global_strategy is None else global_strategy
    if not isinstance(strategy, Strategy):
        raise TypeError(f"global_strategy must be a fedlearn_edu Strategy, got {type(strategy).__name__}.")
    if not (lam >= 0 and lam < float("inf")):
        raise ValueError(f"Ditto's lam must be a finite number >= 0, got {lam}.")
    pe = local_epochs if personal_epochs is None else personal_epochs
    name = "ditto" if type(strategy) is FedAvg else f"ditto+{getattr(strategy, 'name', type(strategy).__name__)}"
    run = _Run(
        name,
        federation,
        model,
        rounds,
        clients_per_round,
        local_epochs,
        batch_size,
        lr,
        lr_decay,
        momentum,
        weight_decay,
        eval_every,
        seed,
        device,
        engine,
        {"lam": float(lam), "personal_epochs": pe, "global_strategy": repr(strategy)},
    )
    params = run.params
    personal = _repeat(params, run.n)
    strategy.init(params)
    global_accs = []

    def evaluate():
        global_accs.append(evaluate_clients(run.model, params, run.fed_dev)[0])
        return evaluate_personal(run.model, personal, run.fed_dev)

    run.record(0, *evaluate())
    runner = make_engine(engine, run.model)
    for t in _progress(range(1, rounds + 1), progress, name):
        ids, config, datasets, seeds = run.select(t)
        # 1. the global part, exactly as in simulate()
        gconfig = strategy.configure_local(config)
        local = runner.train(run.model, params, datasets, gconfig, seeds)
        signals = strategy.client_signals(run.model, params, local, datasets)
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        _check_finite(t, ids, local.params, "global local training")
        # 2. the personal part (stays on the client); its own batch order
        pseeds = [derive_seed(seed, t, i, 0xD1770) for i in ids.tolist()]
        dev_ids = ids.to(run.dev)
        pres = ditto_personal_update(
            run.model,
            {k: v[dev_ids] for k, v in personal.items()},
            params,
            datasets,
            config.replace(epochs=pe),
            lam,
            pseeds,
            engine=engine,
        )
        _check_finite(t, ids, pres.params, "the personal update")
        for k in personal:
            personal[k][dev_ids] = pres.params[k].detach()
        # 3. the server aggregates the global part
        updates = ClientUpdates(t, ids, deltas, run.num_samples[ids], local.train_loss, run.model, signals)
        params, diag = server_step(strategy, params, updates, name)
        run.history.selected.append(ids.numpy())
        run.history.train_loss.append(float(pres.train_loss.mean()))
        run.history.diagnostics.append(diag)
        if run.due(t):
            run.record(t, *evaluate())
    h = run.finish()
    h.global_client_accuracy = np.stack(global_accs)
    h.personal_params = {k: v.cpu() for k, v in personal.items()}
    h.final_params = {k: v.cpu() for k, v in params.items()}
    return h

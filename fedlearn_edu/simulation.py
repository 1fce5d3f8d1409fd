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
import os
import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from . import checkpoint as _ckpt
from .attacks import Attack, AttackState
from .checks import (
    check_bool,
    check_int,
    check_model_data,
    check_seed,
    check_trainable,
)
from .data.federation import Federation
from .engine import make_engine
from .evaluation import PooledTestSplits, evaluate_clients, evaluate_models, evaluation_due
from .history import DIAGNOSTICS, History, format_table
from .params import Params, get_params, select_rows, to_device
from .round import check_lr_decay, keep_finite, local_training, nonfinite_error, round_config, server_step
from .secagg import check_secure_aggregation
from .strategies.base import ClientUpdates, ClientWork, Strategy
from .utils import derive_seed, resolve_device

# History, evaluate_clients, format_table and the round's pieces were defined here before: still importable from here
__all__ = [
    "simulate",
    "History",
    "evaluate_clients",
    "format_table",
    "ON_NONFINITE",
    "DIAGNOSTICS",
    "check_run_arguments",
    "check_lr_decay",
    "local_training",
    "round_config",
    "server_step",
]

ON_NONFINITE = ("raise", "skip")


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
    _check_run(federation, model, strategy, rounds, clients_per_round, eval_every, lr_decay, seed)
    progress, secure_aggregation, checkpoint, wanted = _check_options(
        progress, secure_aggregation, on_nonfinite, checkpoint, resume, checkpoint_every, diagnostics, strategy
    )
    attack_state = _start_attack(attack, strategy, len(federation))
    if secure_aggregation:
        check_secure_aggregation(strategy)
    if attack is not None:
        federation = attack.poison(federation, attack_state)  # label flipping: the attackers' labels reversed
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
    test = PooledTestSplits(federation, dev)
    sampler = torch.Generator().manual_seed(derive_seed(seed, 0xC11E47))
    server_state, client_state = strategy.init_state(params0, net, num_clients, seed)
    server_state = to_device(server_state, dev)  # all of it on the run's device, as after a resume
    config = dict(
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
        diagnostics=wanted,
    )
    if attack is not None:
        config["attack"] = attack.describe()
    if secure_aggregation:
        config["secure_aggregation"] = True
    settings = None if checkpoint is None else _ckpt.run_settings(config, federation, net, strategy)
    attackers = None if attack is None else attack_state.attackers.numpy()
    history = History(strategy=name, config=config, evaluated=strategy.evaluates, attackers=attackers)
    first = 1
    if resume and os.path.exists(checkpoint):
        server_state, client_state, history, attack_state, first = _ckpt.resume_run(
            checkpoint, settings, server_state, client_state, strategy, sampler, history, attack_state, dev
        )

    def record(t: int) -> None:
        results = evaluate_models(strategy, net, server_state, client_state, train_sets, federation, test)
        history.add_evaluation(t, results)

    start = time.perf_counter()
    if first == 1:
        record(0)
    bar = _progress(range(first, rounds + 1), progress, name)
    for t in bar:
        ids = torch.randperm(num_clients, generator=sampler)[:m].sort().values
        config_t = round_config(strategy, base_config, lr_decay, t)
        work = ClientWork.for_round(t, ids, train_sets, config_t, net, runner, seed, num_samples)
        out = strategy.client_update(work, server_state, select_rows(client_state, ids.to(dev)))
        if attack is not None:
            theta_t = strategy.server_params(server_state)
            out.deltas, attack_state = attack.update(out.deltas, ids, attack_state, t, theta_t, strategy.server_lr)
        updates = ClientUpdates(t, ids, out.deltas, num_samples[ids], out.train_loss, net, out.signals, work.config)
        recorded = out.train_loss if out.recorded_loss is None else out.recorded_loss
        kept = keep_finite(updates, out.state, recorded, bad_data=bad_data)  # marks the kept updates checked
        if kept.dropped and on_nonfinite == "raise":
            raise nonfinite_error(t, kept.dropped, work.config, strategy, server_state, params0)
        history.selected.append(ids.numpy())
        history.dropped.append(kept.dropped)
        if kept.updates.num_clients == 0:
            warnings.warn(f"Round {t}: every selected client was dropped ({kept.dropped}); the round is skipped.")
            history.train_loss.append(float("nan"))
            history.diagnostics.append({})
        else:
            conflicts = "conflicts" in wanted
            server_state, diag = server_step(strategy, server_state, kept.updates, name, conflicts=conflicts)
            _write_rows(client_state, kept.updates.client_ids, kept.state)
            history.train_loss.append(float(kept.recorded_loss.mean()))
            history.diagnostics.append(diag)
        if evaluation_due(t, eval_every, rounds):
            record(t)
            if progress and hasattr(bar, "set_postfix"):
                bar.set_postfix(mean_acc=f"{np.nanmean(history.client_accuracy[-1]):.3f}")
        if checkpoint is not None and (t % checkpoint_every == 0 or t == rounds):
            _ckpt.save_run(checkpoint, settings, t, server_state, client_state, sampler, history, attack_state)
    history.seconds = time.perf_counter() - start
    final = strategy.server_params(server_state)
    history.final_params = None if final is None else {k: v.cpu() for k, v in final.items()}
    history.final_state = to_device(client_state, "cpu")
    history.final_server_state = to_device(server_state, "cpu")
    return history


def _check_run(federation, model, strategy, rounds, clients_per_round, eval_every, lr_decay, seed) -> None:
    """``simulate``'s strategy and model types, then :func:`check_run_arguments`."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a fedlearn_edu Strategy (e.g. FedAvg()), got {type(strategy).__name__}.")
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (e.g. make_model('mlp', ...)), got {type(model).__name__}: {model!r}."
        )
    check_run_arguments(
        federation, rounds, clients_per_round, eval_every, lr_decay, model=model, seed=seed, strategy=strategy
    )


def _check_options(
    progress, secure_aggregation, on_nonfinite, checkpoint, resume, checkpoint_every, diagnostics, strategy: Strategy
) -> tuple[bool, bool, str | None, tuple[str, ...]]:
    """``simulate``'s flags, NaN policy, checkpoint and diagnostics, checked.

    Returns ``(progress, secure_aggregation, checkpoint path or None, diagnostics recorded)``.
    """
    progress = check_bool(progress, "progress")
    secure_aggregation = check_bool(secure_aggregation, "secure_aggregation")
    if on_nonfinite not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}.")
    checkpoint = _ckpt.check_checkpoint_args(checkpoint, resume, checkpoint_every)
    return progress, secure_aggregation, checkpoint, _diagnostics(diagnostics, strategy)


def _check_lr_fits(lr: float, params: Params) -> None:
    """The client lr must be a number of the parameters' dtype (the engines' SGD step takes it as one)."""
    for p in params.values():
        if p.is_floating_point() and lr > torch.finfo(p.dtype).max:
            raise ValueError(
                f"lr={lr!r} is too large for {p.dtype} parameters (at most {torch.finfo(p.dtype).max:.3g})."
            )


def _start_attack(attack, strategy: Strategy, num_clients: int) -> AttackState | None:
    """The attack's state before round 1 (``None`` without an attack), after checking it fits the strategy."""
    if attack is None:
        return None
    if not isinstance(attack, Attack):
        raise TypeError(f"attack must be a fedlearn_edu.attacks.Attack (or None), got {type(attack).__name__}.")
    return attack.init(num_clients, strategy)


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


def _write_rows(tree: dict, index: Tensor, rows: dict) -> None:
    """``tree[...][index] = rows[...]`` for every tensor of ``rows`` (in place)."""
    for k, v in rows.items():
        if isinstance(v, dict):
            _write_rows(tree[k], index, v)
        else:
            tree[k][index.to(tree[k].device)] = v.detach()

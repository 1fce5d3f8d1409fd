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
from .evaluation import _TestSet, evaluate_clients, evaluate_models, evaluation_due
from .history import DIAGNOSTICS, History, format_table
from .params import Params, get_params, map_tensors, select_rows, to_device
from .round import DATA_REASON, UPDATE_REASON, bad_clients
from .secagg import check_secure_aggregation
from .strategies.base import ClientUpdates, ClientWork, Strategy
from .utils import derive_seed, resolve_device

__all__ = ["simulate", "History", "evaluate_clients", "format_table", "ON_NONFINITE", "DIAGNOSTICS"]

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
    new_state = map_tensors(Tensor.detach, new_state)
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
    server_state = to_device(server_state, dev)  # all of it on the run's device, as after a resume
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
        server_state = to_device(saved["server_state"], dev)
        client_state = to_device(saved["client_state"], dev)
        sampler.set_state(saved["sampler"])
        history = History.from_state(saved["history"], config)
        history.attackers = attacked
        if attack is not None and attack.needs_previous:
            previous = to_device(saved.get("attack_state", {}).get("previous"), dev)
        first = saved["round"] + 1
        if history.eval_rounds[-1] % eval_every and first <= rounds:
            history.drop_last_evaluation()  # the earlier run's final evaluation, off this run's grid

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
        if evaluation_due(t, eval_every, rounds):
            record(t)
            if progress and hasattr(bar, "set_postfix"):
                bar.set_postfix(mean_acc=f"{np.nanmean(history.client_accuracy[-1]):.3f}")
        if checkpoint is not None and (t % checkpoint_every == 0 or t == rounds):
            payload = {
                "version": CHECKPOINT_VERSION,
                "settings": settings,
                "round": t,
                "server_state": to_device(_ckpt.loadable(server_state), "cpu"),
                "client_state": to_device(client_state, "cpu"),
                "sampler": sampler.get_state(),
                "history": history.to_state(),
            }
            if previous is not None:  # an optional entry: the layout of every other run is unchanged
                payload["attack_state"] = {"previous": to_device(previous, "cpu")}
            _ckpt.save(checkpoint, payload)
    history.seconds = time.perf_counter() - start
    final = strategy.server_params(server_state)
    history.final_params = None if final is None else {k: v.cpu() for k, v in final.items()}
    history.final_state = to_device(client_state, "cpu")
    history.final_server_state = to_device(server_state, "cpu")
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

"""The building blocks of one round that :func:`~fedlearn_edu.simulate` and the Flower adapter share.

One round t, as both run it (the Flower adapter split at the network, :mod:`fedlearn_edu.flower.bridge`):

1. :func:`round_config`: the clients' local-training settings of round t (from the run's
   :func:`local_training` settings, the lr decay and the strategy's ``configure_local``);
2. ``strategy.client_update``: the selected clients train
   (:class:`~fedlearn_edu.strategies.ClientWork`, the same batch orders in both);
3. :func:`keep_finite`: the bad-client policy (:func:`bad_clients`, below) drops the clients
   whose output is not finite; ``simulate(..., on_nonfinite="raise")`` raises
   :func:`nonfinite_error` instead;
4. :func:`server_step`: ``strategy.aggregate`` on the kept clients' updates, checked.

**The bad-client policy** (:func:`bad_clients`): a client whose round output -- its update,
its new client state or a per-client signal it reports -- holds NaN/Inf is dropped for the
round, with a reason naming which part was bad. The simulator applies it to the stacked
outputs of the selected clients, a Flower node to its own output (it alone sees its new
client state, which never leaves it) and :class:`~fedlearn_edu.flower.FlowerStrategy` to
the replies it received (plus what each node found about its state), so both paths drop the
same clients for the same reasons. After the policy the kept updates are finite: :func:`keep_finite`
marks them (``ClientUpdates.checked``) and the aggregation functions skip their own scan
(their ``check=False``).

The reasons (``History.dropped``, ``FlowerStrategy.diagnostics[t]["dropped_reasons"]``):

===============================  ===================================================================
the part with NaN/Inf            reason
===============================  ===================================================================
the client's training data       ``"its training data hold NaN/Inf values"`` (:data:`DATA_REASON`;
                                 the simulator knows the data; it comes first)
the update ``Delta_i``           ``"local training diverged (NaN/Inf in the update)"``
                                 (:data:`UPDATE_REASON`)
new client state ``key``         ``"NaN/Inf in its new client state 'key'"`` (SCAFFOLD's ``control``)
signal ``key``                   ``"NaN/Inf in its signal 'key'"`` (FedOUI's ``oui``)
===============================  ===================================================================

A client with several bad parts gets the first reason of the table.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .aggregators import count_conflicts
from .checks import all_finite, check_float, check_int, nonfinite_keys
from .engine import MAX_EPOCHS, LocalTraining
from .params import Params, map_tensors, select_rows, tree_leaves
from .strategies.base import ClientUpdates, Strategy

__all__ = [
    "local_training",
    "check_lr_decay",
    "round_config",
    "bad_clients",
    "keep_finite",
    "KeptClients",
    "nonfinite_error",
    "server_step",
    "DATA_REASON",
    "UPDATE_REASON",
    "state_reason",
    "signal_reason",
]

DATA_REASON = "its training data hold NaN/Inf values"
UPDATE_REASON = "local training diverged (NaN/Inf in the update)"


def state_reason(key: str) -> str:
    """The reason for a client whose new client state ``key`` holds NaN/Inf.

    Args:
        key: the client-state entry (e.g. SCAFFOLD's ``"control"``).

    Returns:
        ``"NaN/Inf in its new client state 'key'"``.
    """
    return f"NaN/Inf in its new client state {key!r}"


def signal_reason(key: str) -> str:
    """The reason for a client whose signal ``key`` holds NaN/Inf.

    Args:
        key: the signal (e.g. FedOUI's ``"oui"``).

    Returns:
        ``"NaN/Inf in its signal 'key'"``.
    """
    return f"NaN/Inf in its signal {key!r}"


def bad_clients(
    client_ids: Tensor | Iterable[int],
    deltas: Mapping,
    state: Mapping | None = None,
    signals: Mapping | None = None,
    *,
    bad_data: Collection[int] = (),
    reported: Mapping[int, str] | None = None,
) -> tuple[Tensor, dict[int, str]]:
    """The bad-client policy: which of the round's m clients to keep, and why the others are dropped.

    A client is dropped when its row of any tensor of ``deltas``, ``state`` or the per-client
    ``signals`` holds NaN/Inf, or when it is in ``reported``. One fused pass over all the
    tensors (:func:`~fedlearn_edu.checks.all_finite`); the rows are looked at one by one only
    when it fails.

    Args:
        client_ids: ``Tensor[m]`` (or m integers): the clients' ids, one per row.
        deltas: the updates ``{name: Tensor[m, ...]}``.
        state: the new client-state rows ``{name: Tensor[m, ...]}`` (nested dicts allowed), or
            ``None`` (a Flower server never sees them).
        signals: the per-client signals ``{name: Tensor[m, ...]}`` (nested dicts allowed); only
            floating-point tensors with a leading axis of m are per-client values and tested.
        bad_data: ids of the clients whose training data hold NaN/Inf: a dropped one among them
            is blamed on its data.
        reported: ``{client id: reason}`` a client found itself (a Flower node checks its new
            client state, which stays on the node): such a client is dropped with that reason.

    Returns:
        ``(keep, dropped)``: ``keep`` ``Tensor[m]`` (bool, CPU), true for the clients kept;
        ``dropped`` ``{client id: reason}`` for the others, in row order (reasons in the
        module docstring).

    Raises:
        ValueError: ``reported`` names a client that is not in ``client_ids``.
    """
    ids = [int(i) for i in client_ids]
    m = len(ids)
    reported = dict(reported or {})
    unknown = sorted(set(reported) - set(ids))
    if unknown:
        raise ValueError(f"reported names client(s) {unknown} that are not among the round's clients {ids}.")
    parts = [(UPDATE_REASON, deltas)]
    parts += [(state_reason(k), v) for k, v in (state or {}).items()]
    parts += [(signal_reason(k), v) for k, v in _row_signals(signals or {}, m).items()]
    keep = torch.ones(m, dtype=torch.bool)
    if not reported and all_finite(v for _, tree in parts for v in _leaves(tree)):
        return keep, {}
    found: dict[int, str] = {}
    for reason, tree in parts:
        for j in (~_finite_rows(m, tree)).nonzero().flatten().tolist():
            found.setdefault(ids[j], reason)
    bad_data = {int(i) for i in bad_data}
    dropped = {}
    for j, i in enumerate(ids):
        reason = reported.get(i, found.get(i))
        if reason is not None:
            keep[j] = False
            dropped[i] = DATA_REASON if i in bad_data else reason
    return keep, dropped


@dataclass
class KeptClients:
    """The round's clients that the bad-client policy keeps (:func:`keep_finite`).

    Attributes:
        updates: the kept clients' :class:`~fedlearn_edu.strategies.ClientUpdates` (m' rows),
            marked ``checked`` (the aggregation functions skip their NaN scan); m' = 0 when
            every client is dropped.
        state: the kept clients' new client-state rows ``{name: Tensor[m', ...]}`` (``None`` when
            none were given: a Flower server never sees them).
        recorded_loss: ``Tensor[m']`` the kept clients' recorded losses (``None`` when none were given).
        keep: ``Tensor[m]`` (bool, CPU), true for the kept clients.
        dropped: ``{client id: reason}`` of the others (:func:`bad_clients`).
    """

    updates: ClientUpdates
    state: dict | None
    recorded_loss: Tensor | None
    keep: Tensor
    dropped: dict[int, str]


def keep_finite(
    updates: ClientUpdates,
    state: Mapping | None = None,
    recorded_loss: Tensor | None = None,
    *,
    bad_data: Collection[int] = (),
    reported: Mapping[int, str] | None = None,
) -> KeptClients:
    """The bad-client policy applied to a round: :func:`bad_clients`, then the bad rows removed.

    The simulator passes the round's stacked outputs (updates, new client state, recorded
    losses); :class:`~fedlearn_edu.flower.FlowerStrategy` the stacked replies and what the nodes
    reported (:func:`fedlearn_edu.flower.bridge.drop_bad_clients`).

    Args:
        updates: the round's m clients' :class:`~fedlearn_edu.strategies.ClientUpdates` (its
            deltas and signals are checked).
        state: their new client-state rows ``{name: Tensor[m, ...]}`` (checked), or ``None``.
        recorded_loss: ``Tensor[m]`` what ``History.train_loss`` averages, or ``None``.
        bad_data: ids of the clients whose training data hold NaN/Inf (see :func:`bad_clients`).
        reported: ``{client id: reason}`` the clients found themselves (see :func:`bad_clients`).

    Returns:
        :class:`KeptClients`; the inputs are not modified.
    """
    keep, dropped = bad_clients(
        updates.client_ids, updates.deltas, state, updates.signals, bad_data=bad_data, reported=reported
    )
    if dropped:
        updates = updates.subset(keep)
        state = None if state is None else select_rows(state, keep)
        recorded_loss = None if recorded_loss is None else recorded_loss[keep.to(recorded_loss.device)]
    return KeptClients(replace(updates, checked=True), state, recorded_loss, keep, dropped)


def _leaves(tree) -> list[Tensor]:
    return tree_leaves(tree) if isinstance(tree, Mapping) else [tree]


def _finite_rows(m: int, tree) -> Tensor:
    """``Tensor[m]`` (bool, CPU): row j of every tensor of ``tree`` is finite."""
    finite = torch.ones(m, dtype=torch.bool)
    for v in _leaves(tree):
        finite &= torch.isfinite(v.reshape(m, -1)).all(1).cpu()
    return finite


def _row_signals(signals: Mapping, m: int) -> dict:
    """The floating-point per-client signals ``Tensor[m, ...]`` (nested dicts kept, empty ones left out)."""
    out = {}
    for k, v in signals.items():
        if isinstance(v, Mapping):
            rows = _row_signals(v, m)
            if rows:
                out[k] = rows
        elif isinstance(v, Tensor) and v.is_floating_point() and v.dim() > 0 and v.shape[0] == m:
            out[k] = v
    return out


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
    strategy: Strategy, server_state: Mapping, updates: ClientUpdates, name: str, conflicts: bool = True
) -> tuple[Mapping, dict]:
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


def nonfinite_error(
    round: int,
    dropped: Mapping[int, str],
    config: LocalTraining,
    strategy: Strategy,
    server_state: Mapping,
    params0: Params,
) -> FloatingPointError:
    """The error ``simulate(..., on_nonfinite="raise")`` raises for the round's dropped clients, with the cause.

    Args:
        round: t.
        dropped: ``{client id: reason}`` (:func:`bad_clients`).
        config: the round's local-training settings (the fix names the client lr, ``prox_mu``, ...).
        strategy: the run's strategy.
        server_state: the server state the clients trained from (a model the server step blew up
            is blamed on the server's step size).
        params0: theta_0, the initial model.

    Returns:
        The ``FloatingPointError``: the clients, by the part that was bad, and what to change.
    """
    blown_up = _blown_up(strategy, server_state, params0)
    return FloatingPointError(_nonfinite_message(round, dict(dropped), config, blown_up, strategy.server_lr, strategy))


TINY_LR = 1e-12  # a client lr below this vanishes in float32 steps; SCAFFOLD's control update divides by it


def _blown_up(strategy: Strategy, server_state: Mapping, params0: Params) -> float | None:
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
            hint = strategy.nonfinite_hint().rstrip(".") if strategy is not None else ""
            fix = (
                f"the server step had already blown the global model up ({blown_up:.2g} times its initial size) "
                f"before local training: {hint or f'lower server_lr (now {server_lr:g})'}"
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

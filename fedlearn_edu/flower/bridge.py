"""The one place where the Flower adapter meets the strategy protocol.

Everything the adapter needs from a :class:`~fedlearn_edu.strategies.Strategy` goes through
the functions below; the rest of :mod:`fedlearn_edu.flower` moves tensors in and out of
Flower's records and never calls a strategy itself. This module does not import Flower.

The protocol (``fedlearn_edu/strategies/base.py``) and where the adapter uses it:

============================  ==============================================================
function here                 strategy call / data it depends on
============================  ==============================================================
:func:`begin_run`             ``strategy.init_state(...)``: the server state the Flower server
                              keeps (the client state it returns is dropped)
:func:`round_config`          ``strategy.configure_local(config)`` (server side, each round;
                              the simulator's own function)
:func:`init_client_state`     ``strategy.init_state(...)``: the node's own row of the client
                              state, created on the node the first time it is needed
:func:`train_client`          ``strategy.client_update(work, server_view, state_rows)`` for the
                              one client of the node (a :class:`~fedlearn_edu.strategies.ClientWork`
                              with m = 1): the same local objective as in ``simulate``
:func:`needed_signals`        ``strategy.needs.signals``: what ``aggregate`` reads
:func:`client_updates`        the fields of :class:`~fedlearn_edu.strategies.ClientUpdates`,
                              ``config`` included (the round's ``LocalTraining``)
:func:`drop_bad_clients`      the simulator's bad-client policy (:func:`fedlearn_edu.round.keep_finite`), which
                              :func:`train_client` applies on the node too
:func:`server_update`         ``strategy.aggregate(server_state, updates)`` (through the
                              round's :func:`~fedlearn_edu.round.server_step`)
============================  ==============================================================

One round, as :func:`~fedlearn_edu.simulate` runs it, split at the network::

    server: config = round_config(strategy, base, lr_decay, t)
            view   = strategy.client_view(server_state)                          -> sent to the nodes
    node:   rows   = the node's client-state rows (init_client_state the first time)
            reply, rows = train_client(strategy, model, view, data, config, seed, t, i, rows)
                                                             -> reply sent back, rows kept on the node
    server: updates = client_updates(strategy, t, model, strategy.server_params(server_state), replies, config)
            updates, dropped = drop_bad_clients(updates, replies)
            server_state, diagnostics = server_update(strategy, server_state, updates)

The server state (the model, the optimizer's moments, the strategy's own tensors) stays on
the server (:class:`~fedlearn_edu.flower.FlowerStrategy` keeps it between rounds); the nodes
receive only ``strategy.client_view(server_state)`` (theta_t; SCAFFOLD adds c). Client state
(Ditto's personal models, SCAFFOLD's ``c_i``, ...) never leaves the node: each node keeps its
own rows ``{name: Tensor[1, ...]}`` between rounds (in Flower's ``Context.state``, see
:mod:`fedlearn_edu.flower.client`), as ``simulate`` keeps row i of its ``Tensor[N, ...]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..checks import check_int, check_seed
from ..engine import LocalTraining, make_engine
from ..params import Params, get_params, select_rows
from ..round import bad_clients, keep_finite, round_config, server_step
from ..strategies.base import ClientUpdates, ClientWork, Strategy

__all__ = [
    "ClientReply",
    "check_one_model",
    "check_client_id",
    "begin_run",
    "round_config",
    "init_client_state",
    "train_client",
    "needed_signals",
    "client_updates",
    "drop_bad_clients",
    "server_update",
]


@dataclass
class ClientReply:
    """What one client sends back after local training (one client, no client axis).

    Attributes:
        client_id: the client's index in the federation (Flower: the node's ``partition-id``).
        deltas: the update ``{name: Tensor[...]}`` of ``strategy.client_update``
            (``Delta_i = theta_i - theta_t`` for FedAvg-like strategies), computed on the node.
        num_samples: n_i, the size of the client's training split.
        train_loss: the client's mean local loss (``ClientOutput.train_loss``).
        signals: per-client values of ``ClientOutput.signals`` (e.g. ``{"oui": Tensor[]}``),
            each without the client axis.
        recorded_loss: the loss the simulator's History records (``ClientOutput.recorded_loss``;
            Ditto: the personal model's); ``None``: ``train_loss``.
        dropped_reason: why the node's bad-client check (:func:`fedlearn_edu.round.bad_clients`
            on its update, new client state and signals) failed, e.g. ``"NaN/Inf in its new
            client state 'control'"``; the server drops the client with it. ``None``: all finite.
    """

    client_id: int
    deltas: Params
    num_samples: int
    train_loss: Tensor
    signals: dict[str, Tensor] = field(default_factory=dict)
    recorded_loss: Tensor | None = None
    dropped_reason: str | None = None


def check_one_model(strategy: Strategy) -> None:
    """Refuse a strategy without one server model (IFCA, local-only, decentralised training).

    Args:
        strategy: the strategy.

    Raises:
        ValueError: ``strategy.needs.server_model`` is not ``"one"``.
    """
    kept = strategy.needs.server_model
    if kept != "one":
        raise ValueError(
            f"{type(strategy).__name__} keeps {'K cluster models' if kept == 'clusters' else 'no global model'} "
            f"(needs.server_model={kept!r}); the Flower adapter exchanges one global model per round. Run it "
            "with fedlearn_edu.simulate, or wrap a one-model strategy (FedAvg, CRAFT, FedVG, FedOUI, Ditto, ...)."
        )


def check_client_id(client_id, num_clients: int | None = None, name: str = "client_id") -> int:
    """A client's index: an integer ``>= 0`` (``< num_clients`` when it is known).

    Args:
        client_id: the index (the node's ``partition-id``).
        num_clients: N, or ``None`` when the caller does not know it.
        name: the argument's name, for the message.

    Returns:
        ``int(client_id)``.

    Raises:
        TypeError: not an integer (``1.7`` is not truncated, bools are refused).
        ValueError: negative (``-1`` would pick the last client's row), or ``>= num_clients``.
    """
    cid = check_int(client_id, name)
    if cid < 0 or (num_clients is not None and cid >= num_clients):
        upper = "" if num_clients is None else f"{num_clients}) (one of the {num_clients} clients"
        raise ValueError(f"{name} must be {f'in [0, {upper})' if upper else '>= 0'}, got {client_id!r}.")
    return cid


def begin_run(strategy: Strategy, params: Params, model: nn.Module, num_clients: int, seed: int) -> dict:
    """The server state at round 0, as :func:`~fedlearn_edu.simulate` starts it.

    ``strategy.init_state(params, model, num_clients, seed)``: the server keeps its server
    state; the client state it returns is not kept on the server (each node makes its own
    row, :func:`init_client_state`).

    Args:
        strategy: the run's strategy (one server model).
        params: theta_0 on the server's device.
        model: the architecture.
        num_clients: N, the number of nodes.
        seed: the run's seed.

    Returns:
        The server state.

    Raises:
        TypeError, ValueError: ``num_clients`` not an integer >= 1, ``seed`` not an integer in
            ``[0, 2**64)`` (a float is refused, not truncated).
    """
    check_one_model(strategy)
    num_clients, seed = check_int(num_clients, "num_clients", 1), check_seed(seed)
    server_state, _ = strategy.init_state(params, model, num_clients, seed)
    return server_state


def _merge(old: dict, new: dict) -> dict:
    """``old`` with the tensors of ``new`` written over it (the simulator's write-back of rows)."""
    out = dict(old)
    for k, v in new.items():
        out[k] = _merge(old.get(k, {}), v) if isinstance(v, dict) else v.detach()
    return out


def init_client_state(
    strategy: Strategy, model: nn.Module, params0: Params, client_id: int, num_clients: int, seed: int
) -> dict:
    """Client ``client_id``'s rows ``{name: Tensor[1, ...]}`` of the strategy's initial client state.

    Row ``client_id`` of ``strategy.init_state(params0, model, num_clients, seed)``: exactly the
    row :func:`~fedlearn_edu.simulate` starts client ``client_id`` with, when ``params0`` is the
    run's theta_0 (the node's own copy of the model, built like the server's).

    Args:
        strategy: the node's side of the run's strategy.
        model: the node's model.
        params0: theta_0.
        client_id: i.
        num_clients: N.
        seed: the run's seed.

    Returns:
        ``{name: Tensor[1, ...]}``.

    Raises:
        TypeError, ValueError: ``client_id`` not in ``[0, num_clients)``, ``num_clients`` not an
            integer >= 1, ``seed`` not an integer in ``[0, 2**64)``.
    """
    num_clients, seed = check_int(num_clients, "num_clients", 1), check_seed(seed)
    cid = check_client_id(client_id, num_clients)
    _, state = strategy.init_state(params0, model, num_clients, seed)
    return select_rows(state, torch.tensor([cid]))


def train_client(
    strategy: Strategy,
    model: nn.Module,
    server_view: dict,
    train_data: tuple[Tensor, Tensor],
    config: LocalTraining,
    run_seed: int,
    round: int,
    client_id: int,
    state: dict | None = None,
    engine="loop",
) -> tuple[ClientReply, dict]:
    """One client's side of a round: ``strategy.client_update`` for this one client.

    Builds the :class:`~fedlearn_edu.strategies.ClientWork` the simulator would build for the
    round's selected clients, restricted to this client (m = 1), and calls
    ``strategy.client_update(work, server_view, state)``: the same local objective (prox
    term, linear terms, per-client start) and the same batch orders as in
    :func:`~fedlearn_edu.simulate`.

    Args:
        strategy: the client side of the run's strategy (its ``client_update``).
        model: the architecture (used through ``functional_call``; not modified).
        server_view: what the server sent, ``strategy.client_view(server_state)``
            (``{"params": theta_t}`` for most strategies) on the model's device.
        train_data: the client's ``(x: Tensor[n, ...], y: Tensor[n])`` on that device.
        config: this round's hyper-parameters (from :func:`round_config` on the server).
        run_seed: the run's seed; with ``round`` and ``client_id`` it fixes the client's batch
            order, ``derive_seed(run_seed, round, client_id)``, as in :func:`~fedlearn_edu.simulate`.
        round: the round t (1-based).
        client_id: the client's index in the federation.
        state: the client's rows of the client state ``{name: Tensor[1, ...]}`` (``{}`` or
            ``None`` for a strategy without client state; see :func:`init_client_state`).
        engine: the local-training engine (``"loop"`` is the reference).

    Returns:
        ``(reply, state)``: the :class:`ClientReply` (tensors detached, on the CPU) and the
        client's new state rows (the old rows with the ones ``client_update`` returned written
        over them; the old rows unchanged when the bad-client policy drops the client -- its
        update, new state or a signal is not finite --, as the simulator does; the reply then
        says why, ``ClientReply.dropped_reason``).

    Raises:
        TypeError, ValueError: ``client_id`` negative or not an integer, ``run_seed`` not an
            integer in ``[0, 2**64)``, ``round`` not an integer >= 1; ``state`` lacks the rows of
            the strategy's client state (SCAFFOLD's ``control``: pass :func:`init_client_state`
            the first time); a signal of ``client_update`` that is a dict of tensors
            (SCAFFOLD's ``delta_c``), which the replies cannot carry.
    """
    state = {} if state is None else state
    cid, run_seed = check_client_id(client_id), check_seed(run_seed, "run_seed")
    round = check_int(round, "round", 1)
    name = type(strategy).__name__
    _, initial = strategy.init_state(get_params(model), model, 1, run_seed)
    missing = sorted(k for k in initial if k not in state)
    if missing:
        raise ValueError(
            f"{name} keeps the client state {sorted(initial)}; state lacks {missing}. Pass the client's rows: "
            "init_client_state(strategy, model, params0, client_id, num_clients, seed) the first time, then "
            "the rows train_client returned."
        )
    engine = make_engine(engine, model)
    work = ClientWork.for_round(round, torch.tensor([cid]), {cid: train_data}, config, model, engine, run_seed)
    out = strategy.client_update(work, server_view, state)
    reply_signals = {}
    for key, value in out.signals.items():
        if isinstance(value, dict):
            raise ValueError(
                f"{name}.client_update returned the signal {key!r} as a dict of tensors; the Flower adapter "
                f"carries one tensor per signal, so {name} does not run on it (run it with fedlearn_edu.simulate)."
            )
        value = torch.as_tensor(value)
        if value.dim() == 0 or value.shape[0] != 1:
            raise ValueError(
                f"{name}.client_update returned the signal {key!r} with shape {tuple(value.shape)}; "
                "expected one value per client on a leading client axis (Tensor[1, ...] here)."
            )
        reply_signals[key] = value[0].detach().cpu()
    recorded = None if out.recorded_loss is None else out.recorded_loss[0].detach().cpu()
    _, dropped = bad_clients([cid], out.deltas, out.state, out.signals)
    reply = ClientReply(
        client_id=cid,
        deltas={k: v[0].detach().cpu() for k, v in out.deltas.items()},
        num_samples=int(train_data[1].shape[0]),
        train_loss=out.train_loss[0].detach().cpu(),
        signals=reply_signals,
        recorded_loss=recorded,
        dropped_reason=dropped.get(cid),
    )
    return reply, (state if dropped else _merge(state, out.state))


def needed_signals(strategy: Strategy) -> tuple[str, ...]:
    """The ``signals`` keys ``strategy.aggregate`` reads (so a reply without them is refused).

    Args:
        strategy: the server's strategy.

    Returns:
        ``strategy.needs.signals``, sorted (FedOUI: ``("oui",)``; q-FedAvg: ``("global_loss",)``).
    """
    return tuple(sorted(strategy.needs.signals))


def client_updates(
    strategy: Strategy,
    round: int,
    model: nn.Module,
    global_params: Params,
    replies: Sequence[ClientReply],
    config: LocalTraining | None = None,
) -> ClientUpdates:
    """Stack the replies of one round into the :class:`ClientUpdates` the strategy aggregates.

    Replies are ordered by client id (as the simulator orders the selected clients); the
    deltas are moved to theta_t's device and dtype. ``config`` is the round's
    :class:`~fedlearn_edu.engine.LocalTraining` (what :func:`round_config` sent to the nodes;
    q-FedAvg reads its ``lr``), carried in ``ClientUpdates.config`` as the simulator does.

    Args:
        strategy: the server's strategy (its declared signals are required).
        round: t.
        model: the architecture.
        global_params: theta_t (``strategy.server_params(server_state)``).
        replies: the round's :class:`ClientReply` s.
        config: the round's settings.

    Returns:
        The stacked :class:`~fedlearn_edu.strategies.ClientUpdates`.

    Raises:
        ValueError: no replies; two replies from one client; a reply whose parameters do not
            match theta_t's names and shapes; a reply without a signal the strategy needs, or
            replies that disagree on which signals they carry.
    """
    if len(replies) == 0:
        raise ValueError(f"Round {round}: no client replies to aggregate.")
    replies = sorted(replies, key=lambda r: r.client_id)
    ids = [r.client_id for r in replies]
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"Round {round}: more than one reply from client(s) {sorted({i for i in ids if ids.count(i) > 1})}."
        )
    for r in replies:
        if r.deltas.keys() != global_params.keys():
            missing = sorted(set(global_params) - set(r.deltas))
            extra = sorted(set(r.deltas) - set(global_params))
            raise ValueError(
                f"Round {round}: client {r.client_id} sent an update that does not match the global model "
                f"(missing {missing[:3]}, unexpected {extra[:3]})."
            )
        for k, v in global_params.items():
            if tuple(r.deltas[k].shape) != tuple(v.shape):
                raise ValueError(
                    f"Round {round}: client {r.client_id} sent {k!r} with shape {tuple(r.deltas[k].shape)}, "
                    f"the global model has {tuple(v.shape)}."
                )
    needed = needed_signals(strategy)
    for r in replies:
        lacking = [s for s in needed if s not in r.signals]
        if lacking:
            raise ValueError(
                f"Round {round}: client {r.client_id}'s reply lacks the signal(s) {lacking} that "
                f"{type(strategy).__name__} aggregates with; its ClientApp must compute them with the same "
                f"strategy's client_update (Node(..., strategy={type(strategy).__name__}(...)))."
            )
    keys = set(replies[0].signals)
    for r in replies[1:]:
        if set(r.signals) != keys:
            raise ValueError(
                f"Round {round}: clients {replies[0].client_id} and {r.client_id} report different signals "
                f"({sorted(keys)} vs {sorted(r.signals)}); every node must run the same strategy."
            )
    device = next(iter(global_params.values())).device
    deltas = {
        k: torch.stack([r.deltas[k].to(device=device, dtype=v.dtype) for r in replies])
        for k, v in global_params.items()
    }
    signals = {s: torch.stack([r.signals[s] for r in replies]).to(device) for s in sorted(keys)}
    return ClientUpdates(
        round=int(round),
        client_ids=torch.tensor(ids, dtype=torch.long),
        deltas=deltas,
        num_samples=torch.tensor([r.num_samples for r in replies], dtype=torch.long),
        train_loss=torch.stack([r.train_loss for r in replies]).to(device),
        model=model,
        signals=signals,
        config=config,
    )


def drop_bad_clients(
    updates: ClientUpdates, replies: Sequence[ClientReply]
) -> tuple[ClientUpdates | None, dict[int, str]]:
    """The round's bad-client policy on the server, as the simulator applies it.

    :func:`fedlearn_edu.round.bad_clients` on the stacked updates and signals, with the
    reasons the nodes reported (a node alone sees its new client state).

    Args:
        updates: the round's stacked updates (:func:`client_updates` of ``replies``).
        replies: the round's :class:`ClientReply` s (their ``dropped_reason``).

    Returns:
        ``(kept, dropped)``: the kept clients' updates, marked ``checked`` (the aggregation
        functions skip their NaN scan), or ``None`` when every client is dropped; and
        ``{client id: reason}`` of the dropped ones, by id.
    """
    reported = {r.client_id: r.dropped_reason for r in replies if r.dropped_reason is not None}
    kept = keep_finite(updates, reported=reported)
    return (kept.updates if kept.updates.num_clients else None), kept.dropped


def server_update(strategy: Strategy, server_state: Mapping, updates: ClientUpdates) -> tuple[Mapping, dict]:
    """The next server state and the round's diagnostics, exactly as the simulator's server step.

    Args:
        strategy: the server's strategy.
        server_state: the server state at round t (not modified).
        updates: the round's updates (:func:`client_updates`).

    Returns:
        ``(server state at t + 1, diagnostics)``.
    """
    return server_step(strategy, server_state, updates, getattr(strategy, "name", type(strategy).__name__))

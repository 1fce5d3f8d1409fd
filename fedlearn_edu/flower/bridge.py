"""The one place where the Flower adapter meets the strategy protocol.

Everything the adapter needs from a :class:`~fedlearn_edu.strategies.Strategy` goes through
the functions below; the rest of :mod:`fedlearn_edu.flower` moves tensors in and out of
Flower's records and never calls a strategy itself. This module does not import Flower.

Today's protocol (``fedlearn_edu/strategies/base.py``) and where the adapter uses it:

============================  ==============================================================
function here                 strategy call / data it depends on
============================  ==============================================================
:func:`begin_run`             ``strategy.init(params)``
:func:`round_config`          ``strategy.configure_local(config)`` (server side, each round)
:func:`train_client`          ``LocalTraining``/engine ``train`` and
                              ``strategy.client_signals(model, params, local, datasets)``
:func:`needed_signals`        which ``signals`` today's strategies read in ``aggregate``
:func:`client_updates`        the fields of :class:`~fedlearn_edu.strategies.ClientUpdates`
:func:`server_update`         ``strategy.aggregate(params, updates)`` (through the
                              simulator's :func:`~fedlearn_edu.simulation.server_step`)
============================  ==============================================================

One round, as :func:`~fedlearn_edu.simulate` runs it, split at the network::

    server: config = round_config(strategy, base, lr_decay, t)          -> sent to the nodes
    node:   reply  = train_client(strategy, model, theta_t, data, config, seed, t, i)  -> sent back
    server: updates = client_updates(strategy, t, model, theta_t, replies)
            theta_{t+1}, diagnostics = server_update(strategy, theta_t, updates)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..engine import LocalTraining, make_engine
from ..params import Params
from ..simulation import server_step
from ..strategies import FedFV, FedOUI, QFedAvg
from ..strategies.base import ClientUpdates, Strategy
from ..utils import derive_seed

__all__ = [
    "ClientReply",
    "begin_run",
    "round_config",
    "train_client",
    "needed_signals",
    "client_updates",
    "server_update",
]


@dataclass
class ClientReply:
    """What one client sends back after local training (one client, no client axis).

    Attributes:
        client_id: the client's index in the federation (Flower: the node's ``partition-id``).
        params: the trained parameters theta_i, ``{name: Tensor[...]}``.
        num_samples: n_i, the size of the client's training split.
        train_loss: mean mini-batch cross-entropy of the local steps.
        num_steps: local SGD steps taken.
        signals: per-client values from ``strategy.client_signals`` (e.g. ``{"oui": Tensor[]}``),
            each without the client axis.
    """

    client_id: int
    params: Params
    num_samples: int
    train_loss: Tensor
    num_steps: int
    signals: dict[str, Tensor] = field(default_factory=dict)


def begin_run(strategy: Strategy, params: Params) -> None:
    """Reset the strategy's server state before round 1 (as :func:`~fedlearn_edu.simulate` does)."""
    strategy.init(params)


def round_config(strategy: Strategy, base: LocalTraining, lr_decay: float, round: int) -> LocalTraining:
    """The local-training hyper-parameters of round ``round`` (1-based).

    Same rule as :func:`~fedlearn_edu.simulate`: the client rate decays as
    ``lr * lr_decay**(round - 1)``, then the strategy may change the config (FedProx's mu).
    """
    return strategy.configure_local(base.replace(lr=base.lr * lr_decay ** (round - 1)))


def train_client(
    strategy: Strategy,
    model: nn.Module,
    global_params: Params,
    train_data: tuple[Tensor, Tensor],
    config: LocalTraining,
    run_seed: int,
    round: int,
    client_id: int,
    engine="loop",
) -> ClientReply:
    """One client's side of a round: local SGD from theta_t, then its signals.

    Args:
        strategy: supplies ``client_signals`` (what the client reports besides theta_i).
        model: the architecture (used through ``functional_call``; not modified).
        global_params: theta_t, ``{name: Tensor}`` on the model's device.
        train_data: the client's ``(x: Tensor[n, ...], y: Tensor[n])`` on that device.
        config: this round's hyper-parameters (from :func:`round_config` on the server).
        run_seed: the run's seed; with ``round`` and ``client_id`` it fixes the client's batch
            order, ``derive_seed(run_seed, round, client_id)``, as in :func:`~fedlearn_edu.simulate`.
        round: the round t (1-based).
        client_id: the client's index in the federation.
        engine: the local-training engine (``"loop"`` is the reference).

    Returns:
        :class:`ClientReply` with tensors detached and on the CPU.
    """
    runner = make_engine(engine, model)
    local = runner.train(model, global_params, [train_data], config, [derive_seed(run_seed, round, client_id)])
    signals = strategy.client_signals(model, global_params, local, [train_data])
    reply_signals = {}
    for name, value in signals.items():
        value = torch.as_tensor(value)
        if value.dim() == 0 or value.shape[0] != 1:
            raise ValueError(
                f"{type(strategy).__name__}.client_signals returned {name!r} with shape {tuple(value.shape)}; "
                "expected one value per client on a leading client axis (Tensor[1, ...] here)."
            )
        reply_signals[name] = value[0].detach().cpu()
    return ClientReply(
        client_id=int(client_id),
        params={k: v[0].detach().cpu() for k, v in local.params.items()},
        num_samples=int(train_data[1].shape[0]),
        train_loss=local.train_loss[0].detach().cpu(),
        num_steps=int(local.num_steps[0]),
        signals=reply_signals,
    )


def needed_signals(strategy: Strategy) -> tuple[str, ...]:
    """The ``signals`` keys ``strategy.aggregate`` reads (so a reply without them is refused).

    Today's protocol does not declare them; this lists the package's strategies that read
    client signals: FedOUI (``"oui"``), q-FedAvg and FedFV with ``loss="global"``
    (``"global_loss"``).
    """
    if isinstance(strategy, FedOUI):
        return ("oui",)
    if isinstance(strategy, QFedAvg) or (isinstance(strategy, FedFV) and strategy.loss == "global"):
        return ("global_loss",)
    return ()


def client_updates(
    strategy: Strategy,
    round: int,
    model: nn.Module,
    global_params: Params,
    replies: Sequence[ClientReply],
) -> ClientUpdates:
    """Stack the replies of one round into the :class:`ClientUpdates` the strategy aggregates.

    Replies are ordered by client id (as the simulator orders the selected clients), and
    ``Delta_i = theta_i - theta_t`` is taken on theta_t's device and dtype.

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
        if r.params.keys() != global_params.keys():
            missing = sorted(set(global_params) - set(r.params))
            extra = sorted(set(r.params) - set(global_params))
            raise ValueError(
                f"Round {round}: client {r.client_id} sent parameters that do not match the global model "
                f"(missing {missing[:3]}, unexpected {extra[:3]})."
            )
        for k, v in global_params.items():
            if tuple(r.params[k].shape) != tuple(v.shape):
                raise ValueError(
                    f"Round {round}: client {r.client_id} sent {k!r} with shape {tuple(r.params[k].shape)}, "
                    f"the global model has {tuple(v.shape)}."
                )
    needed = needed_signals(strategy)
    for r in replies:
        lacking = [s for s in needed if s not in r.signals]
        if lacking:
            raise ValueError(
                f"Round {round}: client {r.client_id}'s reply lacks the signal(s) {lacking} that "
                f"{type(strategy).__name__} aggregates with; its ClientApp must compute them with the same "
                f"strategy's client_signals (make_client_app(..., strategy={type(strategy).__name__}(...)))."
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
        k: torch.stack([r.params[k].to(device=device, dtype=v.dtype) for r in replies]) - v.unsqueeze(0)
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
    )


def server_update(strategy: Strategy, params: Params, updates: ClientUpdates) -> tuple[Params, dict]:
    """theta_{t+1} and the round's diagnostics, exactly as the simulator's server step computes them."""
    return server_step(strategy, params, updates, getattr(strategy, "name", type(strategy).__name__))

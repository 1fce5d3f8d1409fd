"""The node side: a Flower ``ClientApp`` that trains a fedlearn_edu model on the node's partition."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from ..data.federation import ClientData, Federation
from ..simulation import evaluate_clients
from ..strategies.base import Strategy
from . import bridge
from .records import arrays_to_params, record_to_config, reply_to_record

__all__ = ["Node", "make_client_app", "node_partition", "NODE_STATE_KEY"]

NODE_STATE_KEY = "fedlearn-node"
"""Key of the ``MetricRecord`` a node keeps in ``Context.state``: ``rounds-trained``,
``last-round``, ``last-train-loss`` (it stays on the node, never sent)."""


@dataclass
class Node:
    """What one node holds: its model architecture, its data and its client-side strategy.

    Attributes:
        model: the architecture (the server's theta_t is loaded into it by name).
        data: the node's :class:`~fedlearn_edu.data.ClientData` (local train and test splits).
        client_id: the node's index in the federation (its ``partition-id``).
        num_classes: size of the label space (for evaluation).
        strategy: supplies ``client_signals`` (FedOUI's OUI, q-FedAvg's losses): the same
            kind of strategy the server runs. Strategies without client signals (FedAvg,
            CRAFT, FedVG) need none here.
    """

    model: nn.Module
    data: ClientData
    client_id: int
    num_classes: int
    strategy: Strategy = field(default_factory=Strategy)


def node_partition(context: Context, federation: Federation) -> tuple[int, ClientData]:
    """The node's client from its ``node_config`` (``partition-id``, ``num-partitions``).

    Raises:
        ValueError: the node config lacks the keys, or they do not fit the federation.
    """
    config = context.node_config
    missing = [k for k in ("partition-id", "num-partitions") if k not in config]
    if missing:
        raise ValueError(
            f"The SuperNode's node_config lacks {missing}; start it with "
            "--node-config 'partition-id=0 num-partitions=N'."
        )
    pid, num = config["partition-id"], config["num-partitions"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (pid, num)) or not 0 <= pid < num:
        raise ValueError(f"node_config needs integers 0 <= partition-id < num-partitions; got {pid!r}, {num!r}.")
    if num != len(federation):
        raise ValueError(f"node_config says num-partitions={num}, but the federation has {len(federation)} clients.")
    return pid, federation[pid]


def make_client_app(
    node_fn: Callable[[Context], Node],
    *,
    engine="loop",
    device: str | torch.device = "cpu",
) -> ClientApp:
    """A Flower ``ClientApp`` that trains with the package's local-training code.

    ``train`` messages: load theta_t, run local SGD with the round's hyper-parameters from the
    server (batch order ``derive_seed(seed, round, partition-id)``, as in
    :func:`~fedlearn_edu.simulate`), compute the strategy's client signals, and reply with
    theta_i, n_i, the training loss and the signals (layout in
    :mod:`fedlearn_edu.flower.records`). ``evaluate`` messages: accuracy and mean
    cross-entropy of theta on the node's local test split. The node's own bookkeeping stays in
    ``context.state[NODE_STATE_KEY]``.

    Args:
        node_fn: builds the node's :class:`Node` from its Flower ``Context`` (called once per
            run and node; see :func:`node_partition` for ``node_config``).
        engine: local-training engine (``"loop"``, the reference, or ``"vmap"``).
        device: where the node trains.

    Returns:
        ``flwr.clientapp.ClientApp``.
    """
    device = torch.device(device)
    nodes: dict[tuple[int, int], Node] = {}

    def node_of(context: Context) -> Node:
        key = (int(context.run_id), int(context.node_id))
        if key not in nodes:
            node = node_fn(context)
            if not isinstance(node, Node):
                raise TypeError(f"node_fn must return a fedlearn_edu.flower.Node, got {type(node).__name__}.")
            # The node trains its own copy: the caller's model and data are never modified.
            nodes[key] = Node(
                copy.deepcopy(node.model).to(device),
                node.data.to(device),
                int(node.client_id),
                int(node.num_classes),
                node.strategy,
            )
        return nodes[key]

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = node_of(context)
        config, server_round, seed = record_to_config(msg.content["config"])
        params = arrays_to_params(msg.content["arrays"], device)
        reply = bridge.train_client(
            node.strategy,
            node.model,
            params,
            (node.data.train_x, node.data.train_y),
            config,
            seed,
            server_round,
            node.client_id,
            engine=engine,
        )
        previous = context.state.get(NODE_STATE_KEY, MetricRecord({"rounds-trained": 0}))
        context.state[NODE_STATE_KEY] = MetricRecord(
            {
                "rounds-trained": int(previous["rounds-trained"]) + 1,
                "last-round": server_round,
                "last-train-loss": float(reply.train_loss),
            }
        )
        return Message(reply_to_record(reply), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        node = node_of(context)
        params = arrays_to_params(msg.content["arrays"], device)
        one = Federation([node.data], node.num_classes)
        accuracy, loss = evaluate_clients(node.model, params, one)
        metrics = MetricRecord(
            {
                "accuracy": float(accuracy[0]),
                "loss": float(loss[0]),
                "num-examples": node.data.num_test,
                "partition-id": node.client_id,
            }
        )
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app

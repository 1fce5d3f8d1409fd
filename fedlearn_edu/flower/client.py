"""The node side: a Flower ``ClientApp`` that trains a fedlearn_edu model on the node's partition."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from ..checks import check_int
from ..data.federation import ClientData, Federation
from ..evaluation import evaluate_models
from ..params import get_params
from ..strategies.base import Strategy
from ..strategies.fedavg import FedAvg
from . import bridge
from .records import arrays_to_state, record_to_config, reply_to_record, state_to_arrays

__all__ = ["Node", "make_client_app", "node_partition", "NODE_STATE_KEY", "CLIENT_STATE_KEY", "client_state"]

NODE_STATE_KEY = "fedlearn-node"
"""Key of the ``MetricRecord`` a node keeps in ``Context.state``: ``rounds-trained``,
``last-round``, ``last-train-loss`` (it stays on the node, never sent)."""

CLIENT_STATE_KEY = "fedlearn-client-state"
"""Key of the ``ArrayRecord`` in ``Context.state`` holding the node's rows of the strategy's
client state (Ditto's personal model, SCAFFOLD's ``c_i``, ...); it stays on the node, never sent."""


@dataclass
class Node:
    """What one node holds: its model architecture, its data and its client-side strategy.

    Attributes:
        model: the architecture (the server's theta_t is used with it by name).
        data: the node's :class:`~fedlearn_edu.data.ClientData` (local train and test splits).
        client_id: the node's index in the federation (its ``partition-id``).
        num_classes: size of the label space (for evaluation).
        strategy: the client side of the run's strategy: its ``client_update`` trains
            (local objective, client signals such as FedOUI's OUI or q-FedAvg's losses,
            client state such as Ditto's personal model), its ``init_state`` gives the node's
            initial client state and its ``eval_models`` the model the node is evaluated on;
            both read the server's ``client_view`` the messages carry. Use the same kind of
            strategy the server runs (``Ditto(...)`` for Ditto). The
            default, ``FedAvg()``'s client side, is plain local SGD from theta_t without signals:
            enough for FedAvg, CRAFT and FedVG, whose ``client_update`` is exactly that
            (FedProx's mu and other ``configure_local`` settings arrive in the round's config).

    The node's client state starts as row ``client_id`` of
    ``strategy.init_state(theta_0, model, num_partitions, seed)`` with theta_0 the parameters of
    ``model``: build the node's model like the server's (same architecture and seed) for the
    simulator's start.
    """

    model: nn.Module
    data: ClientData
    client_id: int
    num_classes: int
    strategy: Strategy = field(default_factory=FedAvg)


def node_partition(context: Context, federation: Federation) -> tuple[int, ClientData]:
    """The node's client from its ``node_config`` (``partition-id``, ``num-partitions``).

    Args:
        context: the node's Flower ``Context``; its ``node_config`` holds the two integer keys.
        federation: the federation the partitions index; ``num-partitions`` must equal its
            number of clients.

    Returns:
        ``(partition-id, federation[partition-id])``: the node's client index and its data.

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


def client_state(context: Context) -> dict:
    """The node's rows of the strategy's client state, ``{name: Tensor[1, ...]}`` (``{}`` before round 1).

    Read it after a run, e.g. ``client_state(grid.contexts[node_id])["personal"]`` for Ditto.

    Args:
        context: the node's Flower ``Context``; the rows live in
            ``context.state[CLIENT_STATE_KEY]`` (an ``ArrayRecord``).

    Returns:
        ``{name: Tensor[1, ...]}``, or ``{}`` when the node has not trained yet.
    """
    if CLIENT_STATE_KEY not in context.state:
        return {}
    return arrays_to_state(context.state[CLIENT_STATE_KEY])


def make_client_app(
    node_fn: Callable[[Context], Node],
    *,
    engine="loop",
    device: str | torch.device = "cpu",
) -> ClientApp:
    """A Flower ``ClientApp`` that trains with the package's strategy protocol.

    ``train`` messages: load the server's view (theta_t, :mod:`fedlearn_edu.flower.records`)
    and the node's client-state rows (from
    ``context.state[CLIENT_STATE_KEY]``; the strategy's ``init_state`` row the first time),
    call ``strategy.client_update`` for this one client with the round's hyper-parameters from
    the server (batch order ``derive_seed(seed, round, partition-id)``), exactly as
    :func:`~fedlearn_edu.simulate` does for its selected clients, keep the new state rows in
    ``context.state`` and reply with Delta_i, n_i, the losses and the signals (layout in
    :mod:`fedlearn_edu.flower.records`). ``evaluate`` messages: accuracy and mean
    cross-entropy, on the node's local test split, of the model the strategy evaluates the
    client on (``eval_models``: theta, or Ditto's personal model). The node's bookkeeping
    stays in ``context.state[NODE_STATE_KEY]``.

    Args:
        node_fn: builds the node's :class:`Node` from its Flower ``Context`` (called once per
            run and node; see :func:`node_partition` for ``node_config``).
        engine: local-training engine (``"loop"``, the reference, or ``"vmap"``).
        device: where the node trains.

    Returns:
        ``flwr.clientapp.ClientApp``.

    Raises:
        TypeError: (when a node first handles a message) ``node_fn`` did not return a
            :class:`Node`, or its ``client_id``/``num_classes`` is not an integer.
        ValueError: (likewise) a negative ``client_id`` or ``num_classes < 1``.
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
                bridge.check_client_id(node.client_id, name="Node.client_id"),
                check_int(node.num_classes, "Node.num_classes", 1),
                node.strategy,
            )
        return nodes[key]

    def state_of(node: Node, context: Context, seed: int) -> dict:
        if CLIENT_STATE_KEY in context.state:
            return arrays_to_state(context.state[CLIENT_STATE_KEY], device)
        num = int(context.node_config.get("num-partitions", node.client_id + 1))
        return bridge.init_client_state(node.strategy, node.model, get_params(node.model), node.client_id, num, seed)

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = node_of(context)
        config, server_round, seed = record_to_config(msg.content["config"])
        view = arrays_to_state(msg.content["arrays"], device)
        reply, state = bridge.train_client(
            node.strategy,
            node.model,
            view,
            (node.data.train_x, node.data.train_y),
            config,
            seed,
            server_round,
            node.client_id,
            state_of(node, context, seed),
            engine=engine,
        )
        context.state[CLIENT_STATE_KEY] = state_to_arrays(state)
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
        view = arrays_to_state(msg.content["arrays"], device)
        seed = int(msg.content["config"].get("seed", 0)) if "config" in msg.content else 0
        state = state_of(node, context, seed)
        one = Federation([node.data], node.num_classes)
        train_set = [(node.data.train_x, node.data.train_y)]
        results = evaluate_models(node.strategy, node.model, view, state, train_set, one)
        metrics = MetricRecord({"num-examples": node.data.num_test, "partition-id": node.client_id})
        for i, (label, (accuracy, loss, _)) in enumerate(results.items()):
            if i == 0:
                metrics["accuracy"], metrics["loss"] = float(accuracy[0]), float(loss[0])
            else:
                metrics[f"accuracy.{label}"] = float(accuracy[0])
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app

"""A Flower ``Grid`` inside one process: ClientApps answer messages at once, no network, no Ray."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from ..checks import check_int

__all__ = ["LocalGrid"]

SERVER_NODE_ID = 1  # Flower's SuperLink node id: the sender of the ServerApp's messages
CLIENT_APP_ERROR = 1  # Error.code of a reply whose ClientApp raised


class LocalGrid(Grid):
    """Run a Flower strategy against ClientApps in this process, one message after another.

    Every node has its own ``Context`` (its ``node_config`` and a ``state`` that persists
    across rounds, as on a SuperNode). Messages are handled in the order they are pushed,
    so a run is deterministic. Flower gives a ``Message`` its sender from the running task,
    so use the grid as a context manager: inside ``with``, messages can be created.

    Args:
        client_app: the ``ClientApp`` every node runs (e.g. from
            :func:`~fedlearn_edu.flower.make_client_app`).
        node_configs: one ``node_config`` per node, e.g.
            ``[{"partition-id": i, "num-partitions": n} for i in range(n)]``.
        run_config: the run's ``run_config`` (the App's ``[tool.flwr.app.config]``).
        run_id: the run's id (an integer >= 0).
        errors: ``"raise"`` (default) re-raises a ClientApp's exception at once; ``"reply"``
            answers with an error message instead, as a SuperNode does (the strategy then
            sees a failed node).

    Raises:
        TypeError: ``client_app`` is not a ``ClientApp``; ``run_id`` is not an integer.
        ValueError: no nodes; ``errors`` is neither ``"raise"`` nor ``"reply"``; a negative ``run_id``.

    Attributes:
        contexts: ``{node_id: Context}``; read a node's ``state`` after the run.

    Example:
        >>> with LocalGrid(client_app, [{"partition-id": 0, "num-partitions": 1}]) as grid:  # doctest: +SKIP
        ...     result = strategy.run(grid, rounds=3)
    """

    def __init__(
        self,
        client_app: ClientApp,
        node_configs: Sequence[Mapping],
        run_config: Mapping | None = None,
        run_id: int = 1,
        errors: str = "raise",
    ):
        """Check the arguments (see the class docstring) and keep them."""
        if not isinstance(client_app, ClientApp):
            raise TypeError(f"client_app must be a flwr ClientApp, got {type(client_app).__name__}.")
        if len(node_configs) == 0:
            raise ValueError("LocalGrid needs at least one node (node_configs is empty).")
        if errors not in ("raise", "reply"):
            raise ValueError(f"errors must be 'raise' or 'reply', got {errors!r}.")
        run_id = check_int(run_id, "run_id", 0)
        self.client_app = client_app
        self.errors = errors
        self._run = Run.create_empty(run_id)
        self.contexts = {
            SERVER_NODE_ID + 1 + i: Context(
                run_id=run_id,
                node_id=SERVER_NODE_ID + 1 + i,
                node_config=dict(config),
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i, config in enumerate(node_configs)
        }
        self._replies: dict[str, Message] = {}
        self._count = 0
        self._saved: tuple | None = None

    def __enter__(self) -> LocalGrid:
        """Stand in for the server's task identity while the grid is in use."""
        self._saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, self._run.run_id, SERVER_NODE_ID
        return self

    def __exit__(self, *exc) -> None:
        """Restore the task identity saved by ``__enter__``."""
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = self._saved
        self._saved = None

    def set_run(self, run: Run) -> None:
        """Flower's Grid API: the run the messages belong to.

        Args:
            run: the ``flwr.supercore.run.Run`` replacing the grid's current one.
        """
        self._run = run

    @property
    def run(self) -> Run:
        """Flower's Grid API: the current run."""
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        """Flower's Grid API: a ``Message`` to node ``dst_node_id``.

        Args:
            content: the message's ``RecordDict``.
            message_type: e.g. ``"train"`` or ``"evaluate"``.
            dst_node_id: the receiving node's id (a key of ``contexts``).
            group_id: the message's group (Flower uses the round number).
            ttl: the time-to-live in seconds (``None``: Flower's default).

        Returns:
            The ``flwr.app.Message`` (its sender is the server: use the grid inside ``with``).
        """
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Flower's Grid API: the ids of the grid's nodes."""
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Hand every message to its node's ClientApp now; a ClientApp that raises gives an error reply.

        Args:
            messages: the messages to deliver, each to ``msg.metadata.dst_node_id``.

        Returns:
            ``list[str]``: one reply id per message (``"local-<k>"``), for :meth:`pull_messages`.

        Raises:
            ValueError: a message is addressed to a node the grid does not have.
            Exception: with ``errors="raise"``, whatever a ClientApp raised (with ``"reply"`` it
                becomes an error reply, ``Error.code`` 1, instead).
        """
        ids = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if node not in self.contexts:
                raise ValueError(f"No node {node} in this LocalGrid (nodes: {sorted(self.contexts)}).")
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as err:
                if self.errors == "raise":
                    raise
                reply = Message(Error(CLIENT_APP_ERROR, f"{type(err).__name__}: {err}"), reply_to=msg)
            self._count += 1
            key = f"local-{self._count}"
            self._replies[key] = reply
            ids.append(key)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Flower's Grid API: the replies to the pushed messages ``message_ids`` (each once).

        Args:
            message_ids: ids returned by :meth:`push_messages`; ids already pulled or unknown
                are skipped.

        Returns:
            ``list[Message]``, the replies in the order of ``message_ids``.
        """
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's Grid API: push ``messages`` and return their replies (``timeout`` unused: replies are immediate).

        Args:
            messages: the messages to deliver (see :meth:`push_messages`).
            timeout: ignored (kept for Flower's signature).

        Returns:
            ``list[Message]``, one reply per message, in order.
        """
        return self.pull_messages(self.push_messages(messages))

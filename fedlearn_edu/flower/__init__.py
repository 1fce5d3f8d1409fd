"""Flower adapter: run any fedlearn_edu strategy across machines with Flower (flwr >= 1.42).

Needs the optional extra ``flower``, that is Flower itself: ``pip install "flwr>=1.42,<2"`` (or
``pip install -e ".[flower]"`` in a checkout). The core package never imports Flower; only this
subpackage does.

* :class:`FlowerStrategy` -- a ``flwr.serverapp.strategy.Strategy`` wrapping any
  fedlearn_edu strategy (the ServerApp side);
* :func:`make_client_app` -- a ``ClientApp`` that trains on the node's partition with the
  strategy's ``client_update`` (the SuperNode side; the node's client state stays in its
  ``Context.state``, :func:`client_state`); :class:`Node`, :func:`node_partition`;
* :class:`LocalGrid` -- the same ServerApp strategy and ClientApp in one process, no network;
* :mod:`~fedlearn_edu.flower.bridge` -- the only module that calls the strategy protocol.

Example:
    >>> from fedlearn_edu import FedAvg, federated_dataset, make_model
    >>> from fedlearn_edu.flower import FlowerStrategy, LocalGrid, Node, make_client_app, node_partition
    >>> fed = federated_dataset("digits", num_clients=3, alpha=1.0, seed=0)
    >>> model = make_model("mlp", fed.input_shape, fed.num_classes, seed=0)
    >>> def node_fn(context):
    ...     pid, data = node_partition(context, fed)
    ...     return Node(model, data, pid, fed.num_classes)
    >>> app = make_client_app(node_fn)
    >>> strategy = FlowerStrategy(FedAvg(), model, seed=0)
    >>> with LocalGrid(app, [{"partition-id": i, "num-partitions": 3} for i in range(3)]) as grid:
    ...     result = strategy.run(grid, rounds=2)
    >>> len(strategy.diagnostics)
    2
"""

from __future__ import annotations

FLWR_REQUIREMENT = "flwr>=1.42,<2"

try:
    import flwr
    from flwr.serverapp.strategy import Strategy as _FlowerStrategyBase  # noqa: F401 - the Message API (>= 1.21)
except ImportError as err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        f"fedlearn_edu.flower needs Flower ({FLWR_REQUIREMENT}), which is not installed: "
        f'pip install "{FLWR_REQUIREMENT}" (the flower extra\'s one dependency; Python >= 3.11).'
    ) from err

_version = tuple(int(p) for p in flwr.__version__.split(".")[:2] if p.isdigit())
if not (1, 42) <= _version < (2, 0):  # pragma: no cover - depends on the installed Flower
    raise ImportError(
        f"fedlearn_edu.flower needs {FLWR_REQUIREMENT}; found flwr {flwr.__version__}. "
        f'pip install "{FLWR_REQUIREMENT}" installs a matching release.'
    )

from . import bridge  # noqa: E402
from .client import CLIENT_STATE_KEY, NODE_STATE_KEY, Node, client_state, make_client_app, node_partition  # noqa: E402
from .local import LocalGrid  # noqa: E402
from .records import arrays_to_params, params_to_arrays  # noqa: E402
from .server import FlowerStrategy  # noqa: E402

__all__ = [
    "FlowerStrategy",
    "make_client_app",
    "Node",
    "node_partition",
    "NODE_STATE_KEY",
    "CLIENT_STATE_KEY",
    "client_state",
    "LocalGrid",
    "params_to_arrays",
    "arrays_to_params",
    "bridge",
    "FLWR_REQUIREMENT",
]

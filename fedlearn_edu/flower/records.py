"""Tensors in and out of Flower's records (``ArrayRecord``, ``MetricRecord``, ``ConfigRecord``).

The message layout both sides of :mod:`fedlearn_edu.flower` agree on:

* server -> node (``train``): ``"arrays"`` the clients' view of the server state,
  ``strategy.client_view(server_state)`` (:func:`state_to_arrays`: nested names joined with
  ``"/"``, e.g. ``"params/fc.weight"`` for theta_t, ``"base/params/fc.weight"`` for Ditto's),
  ``"config"`` the round's
  :class:`~fedlearn_edu.engine.LocalTraining` fields plus ``server-round`` and ``seed``;
* node -> server (``train`` reply): ``"deltas"`` the client's update Delta_i (an
  ``ArrayRecord``, as ``strategy.client_update`` computed it on the node: the server adds
  nothing and subtracts nothing, so the sums it aggregates are the simulator's),
  ``"metrics"`` (``num-examples``, ``train-loss``, ``partition-id``, ``recorded-loss`` when
  the strategy records another loss (Ditto), and one ``signal.<name>`` entry per client
  signal, a float or a list of floats) and ``"signal-dtypes"``, a ``ConfigRecord`` with each
  signal's dtype and shape, so the server rebuilds the very tensors the client computed; and,
  when the node's bad-client check failed, ``"dropped"``, a ``ConfigRecord`` whose ``reason``
  says why (:mod:`fedlearn_edu.round`; e.g. its new client state holds NaN).
  The reply carries Delta_i, not theta_i: Flower's built-in strategies (which average
  theta_i) do not read it, and Flower's DP clipping wrappers and SecAgg+ do not fit it
  (:mod:`fedlearn_edu.flower.server` says what they do);
* node (``Context.state``, never sent): ``"fedlearn-client-state"``, the node's rows of the
  strategy's client state (:func:`state_to_arrays`).
* server -> node (``evaluate``): ``"arrays"`` the clients' view of the server state (as for
  ``train``); reply ``"metrics"`` with
  ``accuracy``, ``loss`` (mean cross-entropy) and ``num-examples`` of the node's test split,
  for the model the strategy evaluates the client on (``eval_models``: Ditto's personal
  model), and ``accuracy.<label>`` for the others (Ditto: ``accuracy.global``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from ..engine import LocalTraining
from ..params import Params
from .bridge import ClientReply

__all__ = [
    "params_to_arrays",
    "arrays_to_params",
    "config_to_record",
    "record_to_config",
    "reply_to_record",
    "record_to_reply",
    "diagnostics_to_metrics",
    "state_to_arrays",
    "arrays_to_state",
]

SIGNAL_PREFIX = "signal."
DROPPED = "dropped"  # the reply's ConfigRecord with the node's reason for dropping itself

_CONFIG_FIELDS = {
    "epochs": "local-epochs",
    "batch_size": "batch-size",
    "lr": "lr",
    "momentum": "momentum",
    "weight_decay": "weight-decay",
    "prox_mu": "prox-mu",
}


def params_to_arrays(params: Mapping[str, Tensor]) -> ArrayRecord:
    """``{name: Tensor}`` -> ``ArrayRecord`` (same names, dtypes and shapes; copied to the CPU).

    Args:
        params: ``{name: Tensor[...]}`` (one model, or a client's delta), on any device.

    Returns:
        The ``ArrayRecord``, one array per name.
    """
    return ArrayRecord({k: v.detach().cpu() for k, v in params.items()})


def arrays_to_params(arrays: ArrayRecord, device: torch.device | str = "cpu") -> Params:
    """``ArrayRecord`` -> ``{name: Tensor}`` on ``device`` (writable copies).

    Args:
        arrays: the record (e.g. a message's ``"arrays"`` or ``"deltas"``).
        device: where the tensors go.

    Returns:
        ``{name: Tensor[...]}`` with the arrays' dtypes and shapes, not sharing memory with the record.
    """
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)).to(device) for k, a in arrays.items()}


def config_to_record(config: LocalTraining, server_round: int, seed: int) -> ConfigRecord:
    """The round's local-training hyper-parameters as a ``ConfigRecord``.

    Args:
        config: the round's settings (after ``strategy.configure_local``).
        server_round: t, sent as ``server-round``.
        seed: the run's seed (the nodes derive their batch order from it).

    Returns:
        The ``ConfigRecord``: ``local-epochs``, ``batch-size``, ``lr``, ``momentum``,
        ``weight-decay``, ``prox-mu``, ``server-round`` and ``seed``.
    """
    record = ConfigRecord({key: getattr(config, f) for f, key in _CONFIG_FIELDS.items()})
    record["server-round"] = int(server_round)
    record["seed"] = int(seed)
    return record


def record_to_config(record: ConfigRecord) -> tuple[LocalTraining, int, int]:
    """Inverse of :func:`config_to_record`: ``(LocalTraining, server_round, seed)``.

    Args:
        record: a train message's ``"config"``.

    Returns:
        ``(LocalTraining, server_round, seed)``.

    Raises:
        ValueError: a key the server always sends is missing (the message did not come from
            a :class:`~fedlearn_edu.flower.FlowerStrategy`).
    """
    missing = [k for k in (*_CONFIG_FIELDS.values(), "server-round", "seed") if k not in record]
    if missing:
        raise ValueError(
            f"The train message's config lacks {missing}; the ServerApp must use fedlearn_edu.flower.FlowerStrategy."
        )
    fields = {f: record[key] for f, key in _CONFIG_FIELDS.items()}
    return LocalTraining(**fields), int(record["server-round"]), int(record["seed"])


def reply_to_record(reply: ClientReply) -> RecordDict:
    """A node's :class:`~fedlearn_edu.flower.bridge.ClientReply` as the content of its reply message.

    Args:
        reply: the one client's reply (deltas ``{name: Tensor[...]}``, signals without the client axis).

    Returns:
        ``RecordDict`` with ``"deltas"`` (``ArrayRecord``), ``"metrics"`` (``num-examples``,
        ``train-loss``, ``partition-id``, ``recorded-loss`` if any, ``signal.<name>``),
        ``"signal-dtypes"`` (each signal's dtype and shape) and ``"dropped"`` (``reason``) when
        the reply has a ``dropped_reason``, the layout of the module docstring.
    """
    metrics = MetricRecord(
        {
            "num-examples": int(reply.num_samples),
            "train-loss": float(reply.train_loss),
            "partition-id": int(reply.client_id),
        }
    )
    if reply.recorded_loss is not None:
        metrics["recorded-loss"] = float(reply.recorded_loss)
    dtypes = ConfigRecord()
    for name, value in reply.signals.items():
        metrics[SIGNAL_PREFIX + name] = (
            float(value) if value.dim() == 0 else [float(x) for x in value.reshape(-1).tolist()]
        )
        dtypes[name] = str(value.dtype).removeprefix("torch.")
        dtypes[f"{name}.shape"] = ",".join(str(int(n)) for n in value.shape)
    content = RecordDict({"deltas": params_to_arrays(reply.deltas), "metrics": metrics, "signal-dtypes": dtypes})
    if reply.dropped_reason is not None:
        content[DROPPED] = ConfigRecord({"reason": str(reply.dropped_reason)})
    return content


def record_to_reply(content: RecordDict, node: int) -> ClientReply:
    """Inverse of :func:`reply_to_record`, with a clear error for a malformed reply.

    Args:
        content: the reply message's content.
        node: the sending node's id (for the error messages).

    Returns:
        The :class:`~fedlearn_edu.flower.bridge.ClientReply` (deltas on the CPU, signals with
        their dtypes and shapes restored).

    Raises:
        ValueError: ``"deltas"`` or ``"metrics"`` is missing, a required metric is missing, or a
            signal's dtype is neither floating point nor int64.
    """
    for key, kind in (("deltas", ArrayRecord), ("metrics", MetricRecord)):
        if not isinstance(content.get(key), kind):
            raise ValueError(
                f"The reply of node {node} has no {kind.__name__} {key!r}; was it sent by make_client_app?"
            )
    metrics = content["metrics"]
    missing = [k for k in ("num-examples", "train-loss", "partition-id") if k not in metrics]
    if missing:
        raise ValueError(f"The reply of node {node} lacks the metrics {missing}.")
    signals = {}
    dtypes = content.get("signal-dtypes", ConfigRecord())
    for key, value in metrics.items():
        if not key.startswith(SIGNAL_PREFIX):
            continue
        name = key[len(SIGNAL_PREFIX) :]
        dtype = getattr(torch, str(dtypes.get(name, "float64")), None)
        if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype == torch.int64):
            raise ValueError(f"The reply of node {node} gives signal {name!r} the dtype {dtypes.get(name)!r}.")
        shape = [int(n) for n in str(dtypes.get(f"{name}.shape", "")).split(",") if n]
        signals[name] = torch.tensor(value, dtype=dtype).reshape(shape)
    return ClientReply(
        client_id=int(metrics["partition-id"]),
        deltas=arrays_to_params(content["deltas"]),
        num_samples=int(metrics["num-examples"]),
        train_loss=torch.tensor(metrics["train-loss"], dtype=torch.float32),
        signals=signals,
        recorded_loss=(
            torch.tensor(metrics["recorded-loss"], dtype=torch.float32) if "recorded-loss" in metrics else None
        ),
        dropped_reason=str(content[DROPPED]["reason"]) if DROPPED in content else None,
    )


def diagnostics_to_metrics(diagnostics: Mapping) -> MetricRecord:
    """The numeric part of a strategy's diagnostics as a ``MetricRecord``.

    Scalars become floats, tensors and arrays become flat lists of floats, lists of numbers
    stay lists; strings (e.g. FedOUI's ``fit_method``) and other objects are left out (they
    stay in :attr:`FlowerStrategy.diagnostics`); a dict of numbers becomes ``key.sub`` entries.

    Args:
        diagnostics: one round's diagnostics ``{name: value}`` (e.g. ``{"weights": Tensor[m]}``).

    Returns:
        The ``MetricRecord`` (empty tensors are left out too).
    """
    out = MetricRecord()
    for key, value in diagnostics.items():
        if isinstance(value, Mapping):
            for sub, v in value.items():
                if _is_number(v):
                    out[f"{key}.{sub}"] = float(v)
        elif _is_number(value):
            out[key] = float(value)
        elif isinstance(value, (Tensor, np.ndarray)):
            tensor = torch.as_tensor(value).detach().cpu().double()
            if tensor.numel():
                out[key] = float(tensor) if tensor.dim() == 0 else tensor.reshape(-1).tolist()
        elif isinstance(value, (list, tuple)) and len(value) and all(_is_number(v) for v in value):
            out[key] = [float(v) for v in value]
    return out


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


STATE_SEPARATOR = "/"


def state_to_arrays(state: Mapping) -> ArrayRecord:
    """A nested dict of tensors as an ``ArrayRecord``: a client's state rows, or the clients' server view.

    Nested names are joined with ``"/"`` (``{"personal": {"fc.weight": ...}}`` ->
    ``"personal/fc.weight"``); dtypes and shapes are kept.

    Args:
        state: ``{name: Tensor or a dict of them}`` (e.g. ``{name: Tensor[1, ...]}``).

    Returns:
        The ``ArrayRecord`` (CPU copies).

    Raises:
        ValueError: a name contains ``"/"``.
    """
    flat = {}

    def walk(prefix: str, tree: Mapping) -> None:
        for key, value in tree.items():
            if STATE_SEPARATOR in key:
                raise ValueError(f"Client-state names may not contain {STATE_SEPARATOR!r}; got {key!r}.")
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                walk(name + STATE_SEPARATOR, value)
            else:
                flat[name] = value.detach().cpu().contiguous()

    walk("", state)
    return ArrayRecord(flat)


def arrays_to_state(arrays: ArrayRecord, device: torch.device | str = "cpu") -> dict:
    """Inverse of :func:`state_to_arrays`: the nested ``{name: Tensor[1, ...]}`` on ``device``.

    Args:
        arrays: the record, names joined with ``"/"``.
        device: where the tensors go.

    Returns:
        The nested dict of tensors (``"personal/fc.weight"`` -> ``{"personal": {"fc.weight": ...}}``).
    """
    state: dict = {}
    for name, value in arrays_to_params(arrays, device).items():
        *path, leaf = name.split(STATE_SEPARATOR)
        node = state
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return state

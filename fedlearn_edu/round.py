"""The building blocks of one round that :func:`~fedlearn_edu.simulate` and the Flower adapter share.

**The bad-client policy** (:func:`bad_clients`): a client whose round output -- its update,
its new client state or a per-client signal it reports -- holds NaN/Inf is dropped for the
round, with a reason naming which part was bad. The simulator applies it to the stacked
outputs of the selected clients, a Flower node to its own output (it alone sees its new
client state, which never leaves it) and :class:`~fedlearn_edu.flower.FlowerStrategy` to
the replies it received (plus what each node found about its state), so both paths drop the
same clients for the same reasons. After the policy the kept updates are finite: the driver
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

import torch
from torch import Tensor

from .checks import all_finite
from .params import tree_leaves

__all__ = ["bad_clients", "DATA_REASON", "UPDATE_REASON", "state_reason", "signal_reason"]

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

"""A strategy whose client update poisons chosen clients, for the bad-client policy's tests.

The same object runs in :func:`~fedlearn_edu.simulate` and on a Flower node (the poison is in
``client_update``, which both call), so both paths see the same three bad clients.
"""

from __future__ import annotations

import torch

from fedlearn_edu import FedOUI

SIGNAL, UPDATE, STATE = 1, 2, 3  # the poisoned clients' ids; the others are honest
REASONS = {
    SIGNAL: "NaN/Inf in its signal 'oui'",
    UPDATE: "local training diverged (NaN/Inf in the update)",
    STATE: "NaN/Inf in its new client state 'visits'",
}


class Poisoned(FedOUI):
    """FedOUI (its server step reads the clients' ``oui`` signal) with a per-client visit counter.

    Client state ``visits`` (``Tensor[N]``, float): how often each client trained. Client
    :data:`SIGNAL` reports a NaN OUI, client :data:`UPDATE` a NaN update and client
    :data:`STATE` a NaN new counter; everything else each of them sends is finite.
    """

    def init_state(self, params, model, num_clients, seed):
        server, _ = super().init_state(params, model, num_clients, seed)
        device = next(iter(params.values())).device
        return server, {"visits": torch.zeros(num_clients, device=device)}

    def client_update(self, work, server_state, state):
        out = super().client_update(work, server_state, state)
        rows = {i: j for j, i in enumerate(work.client_ids.tolist())}
        out.state = {"visits": state["visits"] + 1}
        if SIGNAL in rows:
            out.signals = {**out.signals, "oui": out.signals["oui"].clone()}
            out.signals["oui"][rows[SIGNAL]] = float("nan")
        if UPDATE in rows:
            out.deltas = {k: v.clone() for k, v in out.deltas.items()}
            for v in out.deltas.values():
                v[rows[UPDATE]] = float("nan")
        if STATE in rows:
            out.state["visits"][rows[STATE]] = float("nan")
        return out

"""Faults: one bad client under every strategy, on both engines."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fedlearn_edu import IFCA, Ditto, FedVG, LocalOnly, federated_dataset, make_model, simulate
from fedlearn_edu.data import server_validation_split
from fedlearn_edu.data.federation import ClientData, Federation
from fedlearn_edu.strategies import SCAFFOLD, STRATEGIES, ClientOutput
from fedlearn_edu.utils import derive_seed

BAD = 4  # the client with NaN data; with SEED it is selected every round, at row 2
SEED = 1
RUN = dict(rounds=3, clients_per_round=4, batch_size=16, lr=0.05, seed=SEED, progress=False)


@pytest.fixture(scope="module")
def setting():
    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)
    fed, val = server_validation_split(fed, fraction=0.2, seed=0)
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, c.info) for c in fed]
    clients[BAD].train_x[0, 0, 0, 0] = float("nan")  # after construction: ClientData refuses NaN inputs
    bad = Federation(clients, fed.num_classes, fed.name)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    return fed, bad, val, model


def _make(name, val):
    extra = {
        "fedvg": lambda: FedVG(val, engine="loop"),
        "dac": lambda: STRATEGIES["dac"](num_neighbours=2),
        "ditto": lambda: Ditto(0.5),
        "ditto_scaffold": lambda: Ditto(0.5, base=SCAFFOLD()),
        "fedvg_scaffold": lambda: FedVG(val, base=SCAFFOLD(), engine="loop"),
        "ifca": lambda: IFCA(2),
        "local": lambda: LocalOnly(),
    }
    return extra[name]() if name in extra else STRATEGIES[name]()


NAMES = sorted(set(STRATEGIES) | {"ditto", "ditto_scaffold", "fedvg_scaffold", "ifca", "local"})


def _excluding(strategy, client: int):
    """The same strategy, except that ``client``'s update is left out of every aggregation and
    its client state is not changed: the run "without that client's update that round"."""
    cls = type(strategy)

    class Excluding(cls):
        def client_update(self, work, server_state, state):
            out = cls.client_update(self, work, server_state, state)
            row = work.client_ids == client
            keep_old = {}
            for k, v in out.state.items():
                if isinstance(v, dict):
                    keep_old[k] = {n: torch.where(_col(row, x), state[k][n], x) for n, x in v.items()}
                else:
                    keep_old[k] = torch.where(_col(row, v), state[k], v)
            return ClientOutput(out.deltas, out.train_loss, out.signals, keep_old, out.recorded_loss)

        def aggregate(self, server_state, updates):
            return cls.aggregate(self, server_state, updates.subset(updates.client_ids != client))

    twin = copy.copy(strategy)
    twin.__class__ = Excluding
    return twin


def _col(row: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return row.to(like.device).reshape(-1, *([1] * (like.dim() - 1)))


def _same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    else:
        assert a == b, path


def test_the_bad_client_is_selected_every_round_at_another_row():
    """The setting is what the tests below assume: client 4 is selected in all 3 rounds at row 2."""
    g = torch.Generator().manual_seed(derive_seed(SEED, 0xC11E47))
    picks = [torch.randperm(6, generator=g)[:4].sort().values.tolist() for _ in range(3)]
    assert all(BAD in p and p.index(BAD) != BAD for p in picks)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("name", NAMES)
def test_skip_drops_only_the_bad_client_and_equals_the_run_without_its_update(setting, name, engine):
    """With on_nonfinite="skip", one client whose data make its update NaN is dropped (and only it)
    by every strategy, and the run is bitwise the run on clean data where that client's update is
    left out of every round's aggregation and its client state kept (AFL: the dropped client
    counts as not selected, so its N/m uses the m - 1 survivors; see AFL's docstring)."""
    fed, bad, val, model = setting
    h = simulate(bad, model, _make(name, val), engine=engine, on_nonfinite="skip", **RUN)
    assert h.dropped == [{BAD: "its training data hold NaN/Inf values"}] * 3
    ref = simulate(fed, model, _excluding(_make(name, val), BAD), engine=engine, **RUN)
    _same(h.final_params, ref.final_params, "final_params")
    _same(h.final_state, ref.final_state, "final_state")
    _same(h.final_server_state, ref.final_server_state, "final_server_state")
    others = [i for i in range(6) if i != BAD]
    np.testing.assert_array_equal(h.client_accuracy[:, others], ref.client_accuracy[:, others])
    np.testing.assert_array_equal(h.client_loss[:, others], ref.client_loss[:, others])
    for label in ref.other_accuracy:
        np.testing.assert_array_equal(h.other_accuracy[label][:, others], ref.other_accuracy[label][:, others])
    assert np.isfinite(h.train_loss).all()


@pytest.mark.parametrize("name", NAMES)
def test_raise_names_the_bad_client_by_its_id(setting, name):
    """With "raise" the error names client 4 (its id), not its row (2) in the round's stack."""
    _, bad, val, model = setting
    with pytest.raises(FloatingPointError, match=rf"Round 1: the training data of client\(s\) \[{BAD}\] hold NaN"):
        simulate(bad, model, _make(name, val), engine="loop", **RUN)

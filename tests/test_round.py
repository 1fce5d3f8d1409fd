"""The round's building blocks (:mod:`fedlearn_edu.round`): the bad-client policy."""

import pytest
import torch

from fedlearn_edu import FedAvg, simulate
from fedlearn_edu.round import DATA_REASON, UPDATE_REASON, bad_clients, signal_reason, state_reason
from fedlearn_edu.strategies import Strategy
from tests.poisoned import REASONS, Poisoned

NAN = float("nan")


def _round(m=4):
    deltas = {"w": torch.zeros(m, 3), "b": torch.zeros(m)}
    state = {"control": {"w": torch.zeros(m, 3)}, "cluster": torch.zeros(m, dtype=torch.long)}
    signals = {"oui": torch.zeros(m), "num_steps": torch.ones(m, dtype=torch.long), "delta_c": {"w": torch.zeros(m, 3)}}
    return deltas, state, signals


def test_every_part_is_checked_and_named():
    """The update, the new client state and the signals are checked; the reason names the part."""
    deltas, state, signals = _round(5)
    deltas["b"][1] = NAN
    state["control"]["w"][2, 0] = float("inf")
    signals["oui"][3] = NAN
    signals["delta_c"]["w"][4, 2] = -float("inf")
    keep, dropped = bad_clients(torch.tensor([10, 11, 12, 13, 14]), deltas, state, signals)
    assert keep.tolist() == [True, False, False, False, False]
    assert dropped == {
        11: UPDATE_REASON,
        12: "NaN/Inf in its new client state 'control'",
        13: "NaN/Inf in its signal 'oui'",
        14: "NaN/Inf in its signal 'delta_c'",
    }
    assert list(dropped) == [11, 12, 13, 14]  # row order
    assert UPDATE_REASON == "local training diverged (NaN/Inf in the update)"  # what History recorded before
    assert state_reason("control") == dropped[12] and signal_reason("oui") == dropped[13]


def test_first_bad_part_wins_and_bad_data_is_blamed_first():
    deltas, state, signals = _round(3)
    for part in (deltas["w"], state["control"]["w"], signals["oui"]):
        part[0] = NAN  # client 0: everything
    state["control"]["w"][1] = NAN
    signals["oui"][1] = NAN  # client 1: state and signal
    keep, dropped = bad_clients([0, 1, 2], deltas, state, signals, bad_data={0, 2})
    assert keep.tolist() == [False, False, True]
    assert dropped == {0: DATA_REASON, 1: state_reason("control")}  # client 2's data are not blamed: it is kept


def test_finite_rounds_keep_everyone_and_ints_or_scalars_are_not_signals():
    deltas, state, signals = _round(3)
    signals["scale"] = torch.tensor(NAN)  # not per client: not checked
    keep, dropped = bad_clients([0, 1, 2], deltas, state, signals)
    assert keep.tolist() == [True] * 3 and dropped == {}
    keep, dropped = bad_clients([0, 1, 2], deltas)  # no state, no signals (a Flower server)
    assert keep.all() and dropped == {}


def test_a_reported_client_is_dropped_with_its_reason():
    """A Flower node finds its own bad state (the server never sees it) and reports it."""
    deltas, _, signals = _round(3)
    signals["oui"][2] = NAN
    keep, dropped = bad_clients([4, 5, 6], deltas, None, signals, reported={5: state_reason("visits")})
    assert keep.tolist() == [True, False, False]
    assert dropped == {5: state_reason("visits"), 6: signal_reason("oui")}
    with pytest.raises(ValueError, match=r"reported names client\(s\) \[9\] that are not among"):
        bad_clients([4, 5, 6], deltas, reported={9: UPDATE_REASON})


def test_simulate_names_the_bad_part_of_each_dropped_client(fed, mlp):
    """A client dropped for a NaN signal or a NaN new state was recorded as 'NaN/Inf in the update'."""
    kw = dict(rounds=2, clients_per_round=len(fed), batch_size=16, progress=False, engine="loop")
    h = simulate(fed, mlp(fed), Poisoned(probe_size=8), on_nonfinite="skip", **kw)
    assert h.dropped == [REASONS, REASONS]
    assert h.final_state["visits"].tolist() == [2, 0, 0, 0, 2, 2]  # the dropped clients' state is kept
    with pytest.raises(FloatingPointError) as err:
        simulate(fed, mlp(fed), Poisoned(probe_size=8), **kw)
    msg = str(err.value)
    assert msg.startswith("Round 1: local training of client(s) [2] diverged (NaN/Inf in the update)"), msg
    assert "client(s) [1]: NaN/Inf in its signal 'oui'" in msg and "[3]: NaN/Inf in its new client state" in msg


class _Spy(Strategy):
    """FedAvg's direction, recording whether the updates it was given were already scanned."""

    seen: list = []

    def direction(self, server_state, updates):
        _Spy.seen.append(updates.checked)
        return FedAvg().direction(server_state, updates)


def test_simulate_scans_once_and_tells_the_aggregators(fed, mlp):
    """The driver's policy scans the updates; the strategy gets ``checked=True`` (its aggregators'
    ``check=False``), never a hidden context."""
    _Spy.seen = []
    simulate(fed, mlp(fed), _Spy(), rounds=2, clients_per_round=3, progress=False)
    assert _Spy.seen == [True, True]

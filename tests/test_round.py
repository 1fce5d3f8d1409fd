"""The round's building blocks (:mod:`fedlearn_edu.round`): the bad-client policy, keep_finite, the errors."""

import numpy as np
import pytest
import torch

from fedlearn_edu import ClientData, FedAvg, Federation, FedVG, QFedAvg, simulate
from fedlearn_edu.aggregators import fedavg
from fedlearn_edu.engine import LocalTraining, LoopEngine
from fedlearn_edu.params import get_params
from fedlearn_edu.round import (
    DATA_REASON,
    UPDATE_REASON,
    bad_clients,
    keep_finite,
    nonfinite_error,
    signal_reason,
    state_reason,
)
from fedlearn_edu.strategies import ClientUpdates, Strategy
from fedlearn_edu.utils import derive_seed
from tests.poisoned import REASONS, Poisoned
from tests.test_simulation import KW, _model

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


def _updates(m=4):
    deltas, _, signals = _round(m)
    return ClientUpdates(
        round=3,
        client_ids=torch.arange(10, 10 + m),
        deltas=deltas,
        num_samples=torch.arange(1, m + 1),
        train_loss=torch.arange(m, dtype=torch.float32),
        model=None,
        signals={"oui": signals["oui"]},
    )


def test_keep_finite_removes_the_bad_rows_everywhere_and_marks_the_rest_checked():
    updates = _updates(4)
    updates.deltas["w"][1, 0] = NAN
    updates.signals["oui"][3] = NAN
    state = {"control": {"w": torch.arange(12.0).reshape(4, 3)}}
    recorded = torch.tensor([0.5, 1.5, 2.5, 3.5])
    before = {k: v.clone() for k, v in updates.deltas.items()}
    kept = keep_finite(updates, state, recorded, bad_data={13})
    assert kept.keep.tolist() == [True, False, True, False]
    assert kept.dropped == {11: UPDATE_REASON, 13: DATA_REASON}
    assert kept.updates.client_ids.tolist() == [10, 12] and kept.updates.checked and not updates.checked
    assert torch.equal(kept.updates.deltas["b"], updates.deltas["b"][[0, 2]])
    assert kept.updates.num_samples.tolist() == [1, 3] and kept.updates.train_loss.tolist() == [0.0, 2.0]
    assert torch.equal(kept.state["control"]["w"], state["control"]["w"][[0, 2]])
    assert kept.recorded_loss.tolist() == [0.5, 2.5]
    assert updates.num_clients == 4 and all(
        torch.allclose(updates.deltas[k], before[k], equal_nan=True) for k in before
    )
    clean = keep_finite(_updates(2))  # a Flower server: no state, no recorded loss
    assert clean.dropped == {} and clean.updates.checked and clean.state is None and clean.recorded_loss is None


def test_flower_and_the_simulator_drop_through_the_same_policy():
    """The Flower server's drop_bad_clients is keep_finite with what the nodes reported."""
    bridge = pytest.importorskip("fedlearn_edu.flower.bridge")
    updates = _updates(3)
    updates.signals["oui"][0] = NAN
    replies = [bridge.ClientReply(10 + j, {}, 1, torch.tensor(0.0)) for j in range(3)]
    replies[1].dropped_reason = state_reason("control")
    kept, dropped = bridge.drop_bad_clients(updates, replies)
    ref = keep_finite(updates, reported={11: state_reason("control")})
    assert dropped == ref.dropped == {10: signal_reason("oui"), 11: state_reason("control")}
    assert kept.client_ids.tolist() == ref.updates.client_ids.tolist() == [12] and kept.checked
    updates.deltas["b"][2] = NAN
    assert bridge.drop_bad_clients(updates, replies)[0] is None  # every client dropped


def test_nonfinite_error_blames_the_client_lr_or_the_server_step():
    strategy = FedAvg(server_lr=3.0)
    params0 = {"w": torch.ones(3)}
    config = LocalTraining(1, 10, 0.5)
    err = nonfinite_error(4, {2: UPDATE_REASON}, config, strategy, {"params": {"w": torch.ones(3)}}, params0)
    assert isinstance(err, FloatingPointError)
    assert str(err).startswith("Round 4: local training of client(s) [2] diverged (NaN/Inf in the update): lower")
    assert "the client lr (now 0.5)" in str(err) and "on_nonfinite='skip'" in str(err)
    blown = nonfinite_error(4, {2: UPDATE_REASON}, config, strategy, {"params": {"w": torch.full((3,), 1e6)}}, params0)
    assert "blown the global model up (1e+06 times" in str(blown) and "lower server_lr (now 3)" in str(blown)


# ------------------------------------------------------------------------ faults
def _with_nan_client(fed, bad=2):
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, c.info) for c in fed]
    clients[bad].train_x[0, 0, 0, 0] = float("nan")  # after construction: ClientData refuses NaN inputs
    return Federation(clients, fed.num_classes, fed.name)


def test_skip_drops_a_client_with_nan_data_and_aggregates_the_others(fed):
    bad_fed = _with_nan_client(fed, bad=2)
    model = _model(fed)
    kw = dict(KW, rounds=1, clients_per_round=6, engine="loop")
    with pytest.raises(FloatingPointError, match=r"training data of client\(s\) \[2\] hold NaN"):
        simulate(bad_fed, model, FedAvg(), **kw)
    h = simulate(bad_fed, model, FedAvg(), on_nonfinite="skip", **kw)
    assert h.dropped == [{2: "its training data hold NaN/Inf values"}]
    assert torch.isfinite(torch.cat([v.flatten() for v in h.final_params.values()])).all()
    # the global model is exactly FedAvg over the five other clients
    theta = get_params(model)
    others = [i for i in range(6) if i != 2]
    cfg = LocalTraining(1, 8, 0.1)
    local = LoopEngine().train(
        model, theta, [(fed[i].train_x, fed[i].train_y) for i in others], cfg, [derive_seed(1, 1, i) for i in others]
    )
    step = fedavg({k: local.params[k] - theta[k] for k in theta}, fed.num_train_samples[others].double())
    for k in theta:
        torch.testing.assert_close(h.final_params[k], theta[k] + step[k])
    assert h.diagnostics[0]["weights"].shape == (5,)


def test_skip_with_every_client_dropped_skips_the_round(fed):
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y) for c in fed]
    for c in clients:
        c.train_x[:] = float("nan")  # after construction: ClientData refuses NaN inputs
    all_bad = Federation(clients, fed.num_classes)
    model = _model(fed)
    with pytest.warns(UserWarning, match="every selected client was dropped"):
        h = simulate(all_bad, model, FedAvg(), on_nonfinite="skip", **dict(KW, rounds=2))
    assert all(torch.equal(h.final_params[k], v) for k, v in get_params(model).items())
    assert [len(d) for d in h.dropped] == [4, 4] and np.isnan(h.train_loss).all()
    with pytest.raises(ValueError, match="on_nonfinite"):
        simulate(fed, model, FedAvg(), on_nonfinite="ignore")


def test_errors_name_the_real_cause(fed):
    model = _model(fed)
    with pytest.raises(FloatingPointError, match="diverged") as err:
        simulate(fed, model, FedAvg(), **dict(KW, lr=1e30, local_epochs=3))
    assert "client lr" in str(err.value)
    with pytest.raises(FloatingPointError, match="server_lr") as err:
        simulate(fed, model, FedAvg(server_lr=1e308), **dict(KW, lr=1.0))
    assert "every client update was finite" in str(err.value) and "client lr" not in str(err.value)
    # q-FedAvg's weights are computed in logarithms: a huge q no longer overflows
    h = simulate(fed, model, QFedAvg(q=1e4), **KW)
    assert all(bool(torch.isfinite(v).all()) for v in h.final_params.values())
    x, y = torch.rand(10, *fed.input_shape), torch.arange(10) % 10
    x[3, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="validation set holds NaN"):
        FedVG((x, y))

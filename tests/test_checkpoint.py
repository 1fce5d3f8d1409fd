"""Resumable runs: a run killed after round r and resumed is bit-identical to the uninterrupted one."""

import os

import numpy as np
import pytest
import torch

from fedlearn_edu import CRAFT, IFCA, Ditto, FedAdam, FedAvgM, make_model, shifted_federation, simulate
from fedlearn_edu.strategies.fedavg import FedAvg

KW = dict(rounds=5, clients_per_round=3, lr=0.1, batch_size=8, eval_every=2, progress=False, seed=2)


@pytest.fixture(scope="module")
def fed():
    return shifted_federation("digits", "label", 2, 3, samples_per_client=24, seed=0)


def _model(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(12,), seed=0)


def _assert_same_history(a, b):
    assert a.eval_rounds == b.eval_rounds
    np.testing.assert_array_equal(a.client_accuracy, b.client_accuracy)
    np.testing.assert_array_equal(a.client_loss, b.client_loss)
    assert a.train_loss == b.train_loss
    assert [s.tolist() for s in a.selected] == [s.tolist() for s in b.selected]
    assert a.dropped == b.dropped and a.evaluated == b.evaluated
    assert a.other_accuracy.keys() == b.other_accuracy.keys()
    for k in a.other_accuracy:
        np.testing.assert_array_equal(a.other_accuracy[k], b.other_accuracy[k])
    assert len(a.diagnostics) == len(b.diagnostics)
    for da, db in zip(a.diagnostics, b.diagnostics):
        assert da.keys() == db.keys()
        for k in da:
            if isinstance(da[k], torch.Tensor):
                assert torch.equal(da[k], db[k]), k
            else:
                assert da[k] == db[k], k
    for k in a.final_params:
        assert torch.equal(a.final_params[k], b.final_params[k]), k


class _Killed(RuntimeError):
    pass


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_killed_and_resumed_run_is_bit_identical(fed, tmp_path, monkeypatch, engine):
    """Ditto on top of FedAdam: global params, Adam's moments, the personal models (client state)
    and the sampler all have to come back exactly."""
    make = lambda: Ditto(0.3, FedAdam(server_lr=0.05))  # noqa: E731
    full = simulate(fed, _model(fed), make(), engine=engine, **KW)
    path = tmp_path / "run.pt"

    original = FedAdam.direction

    def crash_in_round_4(self, params, updates):
        if updates.round == 4:
            raise _Killed("killed")
        return original(self, params, updates)

    monkeypatch.setattr(FedAdam, "direction", crash_in_round_4)
    with pytest.raises(_Killed):
        simulate(fed, _model(fed), make(), engine=engine, checkpoint=path, checkpoint_every=1, **KW)
    monkeypatch.setattr(FedAdam, "direction", original)
    saved = torch.load(path, weights_only=True)  # no pickled code in a checkpoint
    assert saved["round"] == 3 and not [f for f in os.listdir(tmp_path) if ".tmp" in f]
    resumed = simulate(fed, _model(fed), make(), engine=engine, checkpoint=path, resume=True, **KW)
    _assert_same_history(full, resumed)
    for k, v in full.final_state["personal"].items():
        assert torch.equal(v, resumed.final_state["personal"][k])
    np.testing.assert_array_equal(full.other_accuracy["global"], resumed.other_accuracy["global"])


@pytest.mark.parametrize("strategy", [lambda: FedAvgM(server_lr=0.5), lambda: CRAFT(0.3), lambda: IFCA(2, 1)])
def test_a_shorter_run_continued_to_more_rounds_is_bit_identical(fed, tmp_path, strategy):
    """rounds=3 (evaluated at its last round, off the eval_every=2 grid), then resumed to 5."""
    full = simulate(fed, _model(fed), strategy(), **KW)
    path = tmp_path / "run.pt"
    short = simulate(fed, _model(fed), strategy(), checkpoint=path, checkpoint_every=2, **dict(KW, rounds=3))
    assert short.eval_rounds == [0, 2, 3]
    resumed = simulate(fed, _model(fed), strategy(), checkpoint=path, resume=True, **KW)
    _assert_same_history(full, resumed)
    if full.model_index is not None:
        np.testing.assert_array_equal(full.model_index, resumed.model_index)
    # resuming a finished run returns its History without training
    again = simulate(fed, _model(fed), strategy(), checkpoint=path, resume=True, **KW)
    _assert_same_history(full, again)


def test_a_checkpoint_of_another_configuration_is_refused(fed, tmp_path):
    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), FedAvg(), checkpoint=path, **dict(KW, rounds=2))
    with pytest.raises(ValueError, match="its seed is 2, this run's is 3"):
        simulate(fed, _model(fed), FedAvg(), checkpoint=path, resume=True, **dict(KW, seed=3))
    with pytest.raises(ValueError, match="its strategy is"):
        simulate(fed, _model(fed), FedAvg(server_lr=0.5), checkpoint=path, resume=True, **KW)
    with pytest.raises(ValueError, match="its local is"):
        simulate(fed, _model(fed), FedAvg(), checkpoint=path, resume=True, **dict(KW, lr=0.2))
    with pytest.raises(ValueError, match="past rounds=1"):
        simulate(fed, _model(fed), FedAvg(), checkpoint=path, resume=True, **dict(KW, rounds=1))
    with pytest.raises(ValueError, match="resume=True needs checkpoint"):
        simulate(fed, _model(fed), FedAvg(), resume=True, **KW)
    torch.save({"something": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a fedlearn_edu checkpoint"):
        simulate(fed, _model(fed), FedAvg(), checkpoint=tmp_path / "other.pt", resume=True, **KW)
    # no file yet: resume starts afresh
    fresh = simulate(fed, _model(fed), FedAvg(), checkpoint=tmp_path / "new.pt", resume=True, **KW)
    assert fresh.eval_rounds == [0, 2, 4, 5] and (tmp_path / "new.pt").exists()


def _assert_same_tree(a, b, path="state"):
    """Nested dicts of tensors / plain values, bitwise equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same_tree(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def _kill_resume_strategies(fed):
    from fedlearn_edu import SCAFFOLD, FedDyn, FedVG
    from fedlearn_edu.data import server_validation_split

    _, val = server_validation_split(fed, fraction=0.2, seed=0)
    return {
        "fedavgm": lambda: FedAvgM(server_lr=0.5),
        "scaffold": lambda: SCAFFOLD(),
        "feddyn": lambda: FedDyn(alpha=0.1),
        "ditto-fedvg": lambda: Ditto(0.3, base=FedVG(val, engine="loop")),
        "ifca": lambda: IFCA(2, 1),
    }


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("name", ["fedavgm", "scaffold", "feddyn", "ditto-fedvg", "ifca"])
def test_kill_and_resume_keeps_the_server_state_bit_identical(fed, tmp_path, monkeypatch, engine, name):
    """Killed in round 4's server step, resumed: the server state (momentum, c, h, FedVG's base
    state, the clusters), the client state and the History equal the uninterrupted run's."""
    import fedlearn_edu.simulation as simulation

    make = _kill_resume_strategies(fed)[name]
    full = simulate(fed, _model(fed), make(), engine=engine, **KW)
    path = tmp_path / "run.pt"
    original = simulation.server_step

    def crash_in_round_4(strategy, state, updates, *args, **kwargs):
        if updates.round == 4:
            raise _Killed("killed")
        return original(strategy, state, updates, *args, **kwargs)

    monkeypatch.setattr(simulation, "server_step", crash_in_round_4)
    with pytest.raises(_Killed):
        simulate(fed, _model(fed), make(), engine=engine, checkpoint=path, **KW)
    monkeypatch.setattr(simulation, "server_step", original)
    assert torch.load(path, weights_only=True)["round"] == 3
    resumed = simulate(fed, _model(fed), make(), engine=engine, checkpoint=path, resume=True, **KW)
    _assert_same_history(full, resumed)
    _assert_same_tree(full.final_server_state, resumed.final_server_state)
    _assert_same_tree(full.final_state, resumed.final_state)


def test_a_checkpoint_of_an_older_format_is_refused_with_what_to_do(fed, tmp_path):
    path = tmp_path / "old.pt"
    simulate(fed, _model(fed), FedAvg(), checkpoint=path, **dict(KW, rounds=2))
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "version": 1}, path)
    with pytest.raises(ValueError, match="format version 1") as err:
        simulate(fed, _model(fed), FedAvg(), checkpoint=path, resume=True, **KW)
    assert (
        str(path) in str(err.value) and "Delete the file" in str(err.value) and "another checkpoint" in str(err.value)
    )

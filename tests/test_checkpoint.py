"""Resumable runs: a run killed after round r and resumed is bit-identical to the uninterrupted one."""

import os
from collections.abc import Mapping

import numpy as np
import pytest
import torch

from fedlearn_edu import (
    CRAFT,
    IFCA,
    Ditto,
    FedAdam,
    FedAvgM,
    chain,
    clip_by_global_norm,
    make_model,
    sgd,
    shifted_federation,
    simulate,
)
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
    """Nested dicts, tuples or typed server states of tensors / plain values, bitwise equal, of the same types."""
    if isinstance(a, Mapping):
        assert type(a) is type(b) and a.keys() == b.keys(), path
        for k in a:
            _assert_same_tree(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (tuple, list)):  # a chain's optimizer state: one state per piece
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{path}/{i}")
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
        "fedavg-clipped": lambda: FedAvg(optimizer=chain(clip_by_global_norm(0.05), sgd(1.0))),
    }


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("name", ["fedavgm", "scaffold", "feddyn", "ditto-fedvg", "ifca", "fedavg-clipped"])
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


# ------------------------------------------------------------- data fingerprints
def _changed(fed, how):
    """A copy of ``fed`` with one change that a sum of the training data cannot see."""
    from fedlearn_edu.data.federation import ClientData, Federation

    cs = [ClientData(c.train_x.clone(), c.train_y.clone(), c.test_x.clone(), c.test_y.clone(), c.info) for c in fed]
    if how == "swap samples between clients":
        a, b = cs[0].train_x[0].clone(), cs[1].train_x[0].clone()
        cs[0].train_x[0], cs[1].train_x[0] = b, a
        ya, yb = cs[0].train_y[0].clone(), cs[1].train_y[0].clone()
        cs[0].train_y[0], cs[1].train_y[0] = yb, ya
    elif how == "swap two labels":
        j = int((cs[0].train_y != cs[0].train_y[0]).nonzero()[0])
        cs[0].train_y[0], cs[0].train_y[j] = cs[0].train_y[j].clone(), cs[0].train_y[0].clone()
    elif how == "zero a test split":
        cs[2].test_x.zero_()
    return Federation(cs, fed.num_classes, fed.name)


@pytest.mark.parametrize("how", ["swap samples between clients", "swap two labels", "zero a test split"])
def test_a_resume_on_changed_data_is_refused(fed, tmp_path, how):
    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), FedAvg(), checkpoint=path, **dict(KW, rounds=2))
    other = _changed(fed, how)
    # the old check (a sum of the training inputs and labels) could not tell these apart
    assert sum(float(c.train_x.double().sum()) + float(c.train_y.sum()) for c in other) == pytest.approx(
        sum(float(c.train_x.double().sum()) + float(c.train_y.sum()) for c in fed)
    )
    with pytest.raises(ValueError, match="written on other data") as err:
        simulate(other, _model(fed), FedAvg(), checkpoint=path, resume=True, **KW)
    expected = {
        "swap samples between clients": "training inputs of client 0",
        "swap two labels": "training labels of client 0",
        "zero a test split": "test inputs of client 2",
    }[how]
    assert expected in str(err.value) and str(path) in str(err.value)
    # the unchanged data still resume
    assert simulate(fed, _model(fed), FedAvg(), checkpoint=path, resume=True, **KW).eval_rounds[-1] == 5


def test_a_resume_with_another_validation_set_or_initial_model_is_refused(fed, tmp_path):
    from fedlearn_edu import FedVG
    from fedlearn_edu.data import server_validation_split

    train, val = server_validation_split(fed, fraction=0.2, seed=0)
    _, val2 = server_validation_split(fed, fraction=0.2, seed=1)
    assert val2[0].shape == val[0].shape
    path = tmp_path / "fedvg.pt"
    simulate(train, _model(fed), FedVG(val, engine="loop"), checkpoint=path, **dict(KW, rounds=2))
    with pytest.raises(ValueError, match="validation inputs differ"):
        simulate(train, _model(fed), FedVG(val2, engine="loop"), checkpoint=path, resume=True, **KW)
    other_init = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(12,), seed=1)
    with pytest.raises(ValueError, match="the model's initial"):
        simulate(train, other_init, FedVG(val, engine="loop"), checkpoint=path, resume=True, **KW)


# ------------------------------------------------------------- broken files
def _written(fed, tmp_path):
    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), FedAvg(), checkpoint=path, **dict(KW, rounds=2))
    return path


class _Foreign:
    pass


@pytest.mark.parametrize("kind", ["empty", "truncated", "corrupt", "garbage", "pickled object", "tensor", "no keys"])
def test_a_broken_checkpoint_gives_one_clear_error(fed, tmp_path, kind):
    """The file, what is wrong with it, what to do -- never torch's raw errors or its advice."""
    import pickle

    path = _written(fed, tmp_path)
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt":
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid : mid + 64]) + data[mid + 64 :])
    elif kind == "garbage":
        path.write_bytes(b"\x00\x01 not a checkpoint at all" * 10)
    elif kind == "pickled object":
        path.write_bytes(pickle.dumps(_Foreign(), protocol=2))
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "no keys":
        saved = torch.load(path, weights_only=True)
        del saved["history"]
        torch.save(saved, path)
    with pytest.raises(ValueError) as err:
        simulate(fed, _model(fed), FedAvg(), checkpoint=path, resume=True, **KW)
    msg = str(err.value)
    assert str(path) in msg and "Delete the file" in msg and "another checkpoint path" in msg, msg
    assert "weights_only" not in msg and "PytorchStreamReader" not in msg and "Errno" not in msg, msg
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)
    assert {
        "empty": "empty",
        "truncated": "truncated",
        "corrupt": "corrupt",
        "garbage": "corrupt",
        "pickled object": "never unpickled",
        "tensor": "not a fedlearn_edu checkpoint",
        "no keys": "damaged",
    }[kind] in msg


# ------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "checkpoint, resume, every, error, match",
    [
        (3, False, 1, TypeError, "checkpoint must be a path"),
        (b"run.pt", False, 1, TypeError, "checkpoint must be a path"),
        ("", False, 1, ValueError, "empty string"),
        ("{tmp}", False, 1, ValueError, "is a directory"),
        ("{tmp}/missing/run.pt", False, 1, ValueError, "does not exist"),
        ("{tmp}/run.pt", "False", 1, TypeError, "resume must be True or False, got 'False'"),
        ("{tmp}/run.pt", 1, 1, TypeError, "resume must be True or False"),
        ("{tmp}/run.pt", False, float("nan"), TypeError, "checkpoint_every must be an integer, got nan"),
        ("{tmp}/run.pt", False, 0, ValueError, "checkpoint_every must be >= 1"),
        (None, True, 1, ValueError, "resume=True needs checkpoint"),
    ],
)
def test_checkpoint_arguments_are_checked_before_round_1(
    fed, tmp_path, monkeypatch, checkpoint, resume, every, error, match
):
    import fedlearn_edu.simulation as simulation

    def no_round(*args, **kwargs):
        raise AssertionError("a round ran although the arguments are invalid")

    monkeypatch.setattr(simulation, "server_step", no_round)
    if isinstance(checkpoint, str):
        checkpoint = checkpoint.format(tmp=tmp_path)
    with pytest.raises(error, match=match):
        simulate(fed, _model(fed), FedAvg(), checkpoint=checkpoint, resume=resume, checkpoint_every=every, **KW)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="POSIX permissions, not as root")
def test_a_read_only_folder_is_refused_before_round_1(fed, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            simulate(fed, _model(fed), FedAvg(), checkpoint=folder / "run.pt", **KW)
    finally:
        folder.chmod(0o700)


def test_stale_temporaries_are_removed_on_the_next_save_and_resume(fed, tmp_path):
    """A save killed mid-write leaves ``<checkpoint>.tmp-<pid>``: the next save (or a resume)
    removes those of dead processes (and this one's); a live process's, other files' stay."""
    path = tmp_path / "run.pt"
    dead = tmp_path / "run.pt.tmp-999999999"  # above any pid_max: no such process
    own = tmp_path / f"run.pt.tmp-{os.getpid()}"
    live = tmp_path / f"run.pt.tmp-{os.getppid()}"
    other = tmp_path / "other.pt.tmp-999999999"
    odd = tmp_path / "run.pt.tmp-notapid"
    for f in (dead, own, live, other, odd):
        f.write_bytes(b"partial")
    simulate(fed, _model(fed), FedAvg(), checkpoint=path, **dict(KW, rounds=1))
    assert not dead.exists() and not own.exists()
    assert live.exists() and other.exists() and odd.exists()
    dead.write_bytes(b"partial")
    import fedlearn_edu.checkpoint as ckpt

    saved = ckpt.load(path, torch.load(path, weights_only=True)["settings"])  # a resume cleans up first
    assert saved["round"] == 1 and not dead.exists()


def test_a_checkpoint_whose_parent_is_a_file_says_so(fed, tmp_path):
    """Not "does not exist": the path runs through a file, which no ``mkdir`` will fix."""
    (tmp_path / "notes.txt").write_text("a file")
    for path in (tmp_path / "notes.txt" / "run.pt", tmp_path / "notes.txt" / "sub" / "run.pt"):
        with pytest.raises(ValueError, match="is a file, not a folder") as err:
            simulate(fed, _model(fed), FedAvg(), checkpoint=path, **KW)
        assert str(path) in str(err.value) and str(tmp_path / "notes.txt") in str(err.value)
        assert "does not exist" not in str(err.value)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux's /proc")
def test_a_checkpoint_under_proc_is_refused_before_round_1_naming_the_path(fed, monkeypatch):
    """/proc looks writable to root, but no file can be created there: torch's save failed after
    round 1 with ``enforce fail at inline_container.cc`` and no path."""
    import fedlearn_edu.simulation as simulation

    def no_round(*args, **kwargs):
        raise AssertionError("a round ran although the checkpoint cannot be written")

    monkeypatch.setattr(simulation, "server_step", no_round)
    with pytest.raises(ValueError) as err:
        simulate(fed, _model(fed), FedAvg(), checkpoint="/proc/run.pt", **KW)
    msg = str(err.value)
    assert "checkpoint='/proc/run.pt'" in msg and "enforce fail" not in msg, msg
    assert "pass another path" in msg, msg
    assert not os.path.exists(f"/proc/run.pt.tmp-{os.getpid()}")


def test_a_save_that_fails_names_the_checkpoint(tmp_path, monkeypatch):
    """A save that fails mid-run (disk full, the folder removed) names the file and leaves no temporary."""
    import fedlearn_edu.checkpoint as ckpt

    def full_disk(obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    path = tmp_path / "run.pt"
    with pytest.raises(OSError, match="could not be written") as err:
        ckpt.save(path, {"round": 1})
    assert str(path) in str(err.value) and "enforce fail" not in str(err.value)
    assert os.listdir(tmp_path) == []


def _resigned(path, edit):
    """The checkpoint at ``path`` edited by ``edit(saved)`` and signed again (its digest recomputed)."""
    import fedlearn_edu.checkpoint as ckpt

    saved = torch.load(path, weights_only=True)
    saved.pop("digest")
    edit(saved)
    torch.save({**saved, "digest": ckpt._digest(saved)}, path)


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda s: s["server_state"]["params"].update({"out.bias": torch.zeros(3)}),
            r"server_state\['params'\]\['out.bias'\] has shape \(3,\); this run's has \(\d+,\)",
        ),
        (
            lambda s: s["server_state"]["params"]["out.bias"].fill_(float("nan")),
            r"server_state\['params'\]\['out.bias'\] holds NaN/Inf",
        ),
        (
            lambda s: s["server_state"]["params"].pop("out.bias"),
            r"server_state\['params'\] lacks \['out.bias'\]",
        ),
        (
            lambda s: s["server_state"]["params"].update(
                {"out.bias": s["server_state"]["params"]["out.bias"].double()}
            ),
            r"server_state\['params'\]\['out.bias'\] is torch.float64; this run's is torch.float32",
        ),
        (
            lambda s: s["server_state"]["control"].update({"out.weight": torch.zeros(2, 2)}),
            r"server_state\['control'\]\['out.weight'\] has shape \(2, 2\)",
        ),
        (
            lambda s: s["client_state"]["control"].update({"out.bias": torch.zeros(1, 10)}),
            r"client_state\['control'\]\['out.bias'\] has shape \(1, 10\); this run's has \(\d+, 10\)",
        ),
    ],
)
def test_a_resigned_checkpoint_with_wrong_shapes_or_nan_names_the_checkpoint(fed, tmp_path, edit, match):
    """An edited file whose checksum was written again passes the digest: its states must still
    fit the run (names, shapes, dtypes, finite parameters) -- not a failure blamed on ``lr``."""
    from fedlearn_edu import SCAFFOLD

    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), SCAFFOLD(), checkpoint=path, **dict(KW, rounds=2))
    _resigned(path, edit)
    with pytest.raises(ValueError, match=match) as err:
        simulate(fed, _model(fed), SCAFFOLD(), checkpoint=path, resume=True, **KW)
    msg = str(err.value)
    assert f"The checkpoint {str(path)!r}" in msg and "Delete the file" in msg, msg
    assert "lr" not in msg, msg


# ------------------------------------------------------------- the run's bookkeeping (save_run / resume_run)
def test_save_run_writes_the_layout_of_before_and_resume_run_restores_it(fed, tmp_path):
    """The on-disk format does not change: the same keys in the same order (plus the optional
    attack_state), and resume_run gives back the states, the sampler, the History and round r + 1."""
    from fedlearn_edu import Attack
    from fedlearn_edu import checkpoint as ckpt
    from fedlearn_edu.history import History

    path = tmp_path / "run.pt"
    kw = dict(KW, rounds=3, eval_every=1, engine="loop")
    attack = Attack("stale_free_rider", fraction=0.5, seed=1)
    run = simulate(fed, _model(fed), FedAvg(), attack=attack, checkpoint=path, **kw)
    saved = torch.load(path, weights_only=True)
    assert list(saved) == [*ckpt.KEYS, "attack_state", "digest"] and list(saved["attack_state"]) == ["previous"]
    simulate(fed, _model(fed), FedAvg(), checkpoint=tmp_path / "plain.pt", **kw)
    assert list(torch.load(tmp_path / "plain.pt", weights_only=True)) == [*ckpt.KEYS, "digest"]

    strategy = FedAvg()
    model = _model(fed)
    server, clients = strategy.init_state({k: v.detach() for k, v in model.named_parameters()}, model, len(fed), 2)
    sampler = torch.Generator()
    config = dict(run.config, rounds=4, eval_every=2)  # a longer run, evaluated every 2 rounds
    fresh = History(strategy="fedavg", config=config, attackers=run.attackers)
    state = attack.init(len(fed))
    out = ckpt.resume_run(str(path), saved["settings"], server, clients, strategy, sampler, fresh, state, "cpu")
    server2, clients2, history, state2, first = out
    assert first == 4 and torch.equal(sampler.get_state(), saved["sampler"])
    assert all(torch.equal(server2["params"][k], saved["server_state"]["params"][k]) for k in server["params"])
    assert history.config is config and history.attackers is run.attackers
    assert history.eval_rounds == [0, 1, 2]  # round 3 is off this run's grid: it evaluates round 4 itself
    assert all(torch.equal(state2.previous[k], saved["attack_state"]["previous"][k]) for k in server["params"])
    with pytest.raises(ValueError, match="is at round 3, past rounds=2"):
        ckpt.resume_run(
            str(path),
            saved["settings"],
            server,
            clients,
            strategy,
            sampler,
            History("x", config=dict(config, rounds=2)),
            state,
            "cpu",
        )

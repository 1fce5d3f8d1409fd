"""fedlearn_edu.benchmark's record store: what resuming redoes, sweeps sharing a folder, killed sweeps.

A stored run is reused only when its files are whole and the code that computed it is this
package's; two sweeps on one folder never take each other's half-written run for a damaged one;
the worker processes of a sweep end with it, even when it is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import execution, store

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = benchmark.BenchmarkProtocol(rounds=2, last_k=1, clients_per_round=2, tuning_seeds=(0,), eval_seeds=(1, 2))
FED = benchmark.parse_federation("dirichlet:0.5", num_clients=4, num_samples=200)


def _configs(seeds=(1, 2)) -> list[dict]:
    fedavg = benchmark.METHODS["fedavg"]
    return [execution._config(fedavg, FED, PROTOCOL, {"server_lr": 1.0}, seed, "eval") for seed in seeds]


def _sweep(out, configs, redone=None) -> dict:
    return benchmark.run_configs(configs, out, backend="sequential", progress=False, redone=redone)


def _consistent(out) -> None:
    """Every stored run is whole: its manifest is this package's and holds its csv's checksum."""
    runs = Path(out) / "runs"
    for path in runs.glob("*.json"):
        meta = json.loads(path.read_text())
        assert meta["key"] == path.stem and meta["status"] == "ok"
        assert meta["csv_sha256"] == store._sha((runs / f"{path.stem}.csv").read_bytes()), path.stem
        assert meta["code_sha256"] == execution._code_sha256()
    assert sorted(p.stem for p in runs.glob("*.csv")) == sorted(p.stem for p in runs.glob("*.json"))


# --------------------------------------------------------------------------- code changes


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """The package's source copied to a folder that stands in for it (its hash recomputed)."""
    copy = tmp_path / "fedlearn_edu"
    shutil.copytree(execution._PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(execution, "_PACKAGE", copy)
    execution._code_sha256.cache_clear()
    yield copy
    monkeypatch.undo()
    execution._code_sha256.cache_clear()


def test_the_code_hash_follows_the_source(package_copy):
    original = execution._code_sha256()
    execution._code_sha256.cache_clear()
    assert execution._code_sha256() == original  # the same source, wherever it sits
    median = package_copy / "aggregators" / "robust.py"
    median.write_text(median.read_text() + "\n_CHANGED = 1\n")
    assert execution._code_sha256() == original  # computed once per process
    execution._code_sha256.cache_clear()
    changed = execution._code_sha256()
    assert changed != original
    (package_copy / "new_module.py").write_text("")
    execution._code_sha256.cache_clear()
    assert execution._code_sha256() not in (original, changed)


def test_a_sweep_resumed_after_a_code_change_reruns_its_runs(tmp_path, package_copy):
    out, configs = tmp_path / "out", _configs()
    keys = [benchmark.run_key(c) for c in configs]
    assert set(_sweep(out, configs).values()) == {"done"}
    assert set(_sweep(out, configs).values()) == {"cached"}  # the same code: reused
    robust = package_copy / "aggregators" / "robust.py"  # e.g. the coordinate-wise median changed
    robust.write_text(robust.read_text().replace("def ", "def  ", 1))
    execution._code_sha256.cache_clear()
    redone: list = []
    assert _sweep(out, configs, redone) == dict.fromkeys(keys, "done")  # computed again, not served
    assert sorted(redone) == sorted(keys)
    _consistent(out)
    assert set(_sweep(out, configs).values()) == {"cached"}


def test_collect_gathers_a_sweep_from_the_stored_runs_alone(tmp_path):
    """collect() took the statuses, methods and federations without reading them (issue 33); they went."""
    configs = _configs()
    statuses = _sweep(tmp_path, configs)
    result = benchmark.BenchmarkResult.collect(tmp_path, [*configs, configs[0]], PROTOCOL, {})
    assert list(result.runs.run_key) == list(statuses) and set(result.runs.status) == {"ok"}
    assert sorted(set(result.records.seed)) == [1, 2] and result.protocol == PROTOCOL and not result.failed
    (tmp_path / "runs" / f"{next(iter(statuses))}.json").unlink()  # the stored .json decides, not a status
    assert list(benchmark.BenchmarkResult.collect(tmp_path, configs, PROTOCOL, {}).runs.status) == ["missing", "ok"]


def test_a_record_that_does_not_name_its_code_is_redone(tmp_path):
    out, configs = tmp_path / "out", _configs()
    _sweep(out, configs)
    path = out / "runs" / f"{benchmark.run_key(configs[0])}.json"
    meta = json.loads(path.read_text())
    del meta["code_sha256"]  # a manifest written before the check
    path.write_text(json.dumps(meta))
    redone: list = []
    statuses = _sweep(out, configs, redone)
    assert redone == [path.stem] and statuses[path.stem] == "done"
    assert list(statuses.values()).count("cached") == 1
    _consistent(out)


# --------------------------------------------------------------------------- damaged manifests


@pytest.mark.parametrize("manifest", ["[]", '"ok"', "3", "null", "flip"])
def test_a_manifest_that_is_not_a_record_is_redone(tmp_path, manifest):
    out, configs = tmp_path / "out", _configs()
    _sweep(out, configs)
    path = out / "runs" / f"{benchmark.run_key(configs[0])}.json"
    if manifest == "flip":  # one flipped bit in the status: "ok" -> "oj"
        path.write_text(path.read_text().replace('"status": "ok"', '"status": "oj"'))
        assert '"oj"' in path.read_text()
    else:  # valid JSON, not an object
        path.write_text(manifest)
    redone: list = []
    statuses = _sweep(out, configs, redone)
    assert redone == [path.stem] and statuses[path.stem] == "done"
    _consistent(out)
    assert set(_sweep(out, configs).values()) == {"cached"}


# --------------------------------------------------------------------------- sweeps sharing a folder


@pytest.fixture
def paused_commit(monkeypatch):
    """Writes of a run's .json by a thread named "paused" wait between the .csv and the .json."""
    reached, go = threading.Event(), threading.Event()
    write = store._atomic_write

    def paused(path, data):
        if path.suffix == ".json" and threading.current_thread().name == "paused" and not go.is_set():
            reached.set()
            assert go.wait(60)
        write(path, data)

    monkeypatch.setattr(store, "_atomic_write", paused)
    yield reached, go
    go.set()


def test_a_run_half_written_by_another_sweep_is_waited_for(tmp_path, paused_commit):
    reached, go = paused_commit
    cfg = _configs()[0]
    key, result = benchmark.run_key(cfg), benchmark.execute(cfg)
    assert result["status"] == "ok"
    meta = {"package_version": execution._version(), "git_commit": "test"}
    writer = threading.Thread(target=store._Store(tmp_path).write, args=(key, cfg, result, meta), name="paused")
    writer.start()
    assert reached.wait(60)
    assert (tmp_path / "runs" / f"{key}.csv").exists() and not (tmp_path / "runs" / f"{key}.json").exists()
    seen = []
    checker = threading.Thread(target=lambda: seen.append(store._Store(tmp_path).status(key)))
    checker.start()
    checker.join(1.0)
    assert checker.is_alive() and seen == []  # waits for the commit instead of taking the run for damaged
    go.set()
    writer.join(60)
    checker.join(60)
    assert seen == ["done"]
    _consistent(tmp_path)


def test_two_sweeps_on_one_folder_leave_a_consistent_store(tmp_path, paused_commit):
    reached, go = paused_commit
    out, configs = tmp_path / "out", _configs()
    first: dict = {}
    sweep = threading.Thread(target=lambda: first.update(_sweep(out, configs)), name="paused")
    sweep.start()
    assert reached.wait(120)  # the first sweep's first run: its .csv written, its .json not yet
    threading.Timer(1.0, go.set).start()
    second: list = []
    statuses = _sweep(out, configs, second)  # started between the two writes
    sweep.join(120)
    assert not sweep.is_alive() and set(first.values()) == {"done"}
    assert second == [] and statuses[benchmark.run_key(configs[0])] == "cached"
    _consistent(out)
    redone: list = []
    assert set(_sweep(out, configs, redone).values()) == {"cached"} and redone == []


# --------------------------------------------------------------------------- a killed sweep


def _processes(marker: bytes) -> list[int]:
    """The live processes whose environment holds ``marker`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_killed_sweep_leaves_no_process_behind(tmp_path):
    out, tag = tmp_path / "out", uuid.uuid4().hex
    marker = f"FEDLEARN_TEST_SWEEP={tag}".encode()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "FEDLEARN_TEST_SWEEP": tag}
    argv = [sys.executable, "-m", "fedlearn_edu", "benchmark", "--methods", "fedavg", "--partitions"]
    argv += ["dirichlet:0.5", "--clients", "4", "--num-samples", "200", "--clients-per-round", "2"]
    argv += ["--rounds", "3", "--last-k", "1", "--tune-seeds", "1", "--seeds", "200", "--edge-cap", "0"]
    argv += ["--jobs", "2", "--out", str(out), "--no-plots", "--no-progress"]
    sweep = subprocess.Popen(argv, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        # the sweep runs in its workers: two processes beside it, and a run stored
        busy = _wait(lambda: len(_processes(marker)) >= 3 and any((out / "runs").glob("*.json")), 180)
        assert busy and sweep.poll() is None, "the sweep did not start its workers, or ended before the kill"
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(60)
        assert _wait(lambda: not _processes(marker), 30), f"left behind: {_processes(marker)}"
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait(60)
        for pid in _processes(marker):  # what this test started and a failure left behind
            os.kill(pid, signal.SIGKILL)

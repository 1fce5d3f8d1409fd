"""The benchmark builds every method through the strategy registry, committed runs unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import execution
from fedlearn_edu.strategies import IFCA, Ditto, FedAvg, LocalOnly
from tests.user_strategy import restored_registry, write_user_module

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "classroom"
COLUMNS = ("mean", "std", "worst10", "best10", "loss", "train_loss")
SPECIAL = ("ditto", "ifca", "local")  # once built by name in benchmark._strategy


@pytest.fixture(scope="module")
def result():
    return benchmark.load(RECORDS)


def _first(result, method: str, phase: str = "eval"):
    runs = result.runs
    return runs[(runs.method == method) & (runs.phase == phase) & (runs.status == "ok")].iloc[0]


def _old_strategy(config: dict):
    """benchmark._strategy's name special cases before the registry built them (for comparison)."""
    settings = dict(config["settings"])
    if config["builder"] == "ditto":
        return Ditto(settings.pop("lam", 0.1), base=FedAvg(**settings))
    return IFCA(**settings) if config["builder"] == "ifca" else LocalOnly()


@pytest.mark.parametrize("method", SPECIAL)
def test_the_committed_keys_and_strategies_of_ditto_ifca_and_local_are_unchanged(result, method):
    """The configuration the grid builds today hashes to the committed key and builds the same strategy."""
    runs = result.runs
    for phase in dict.fromkeys(runs[runs.method == method].phase):  # local-only: one candidate, no tuning
        run = _first(result, method, phase)
        config = json.loads(run.config)
        fed = config["federation"]
        spec = benchmark.parse_federation(
            fed["name"], dataset=fed["dataset"], num_clients=fed["num_clients"], model=fed["model"]
        )
        again = execution._config(
            benchmark.METHODS[method], spec, result.protocol, config["settings"], config["seed"], phase
        )
        assert again == config and benchmark.run_key(again) == run.run_key
        assert repr(execution._strategy(config, None)) == repr(_old_strategy(config))


@pytest.mark.records
@pytest.mark.parametrize("method", SPECIAL)
def test_a_committed_ditto_ifca_and_local_run_is_reproduced(result, method):
    run = _first(result, method)
    (live,) = benchmark.replay([json.loads(run.config)], cpu_capability=benchmark.RECORDS_CPU_CAPABILITY)
    assert live["status"] == "ok", live.get("error")
    match = benchmark.match_record(live, result.records[result.records.run_key == run.run_key], COLUMNS)
    assert match["ok"], (method, match["why"])  # bit for bit where round 0 is (this machine's arithmetic)


def _row(r, **values):
    base = {"mean": 0.5, "std": 0.1, "worst10": 0.2, "best10": 0.8, "loss": 1.5, "train_loss": 1.4}
    return {"round": r, **base, **values}


@pytest.mark.parametrize(
    ("rows", "identical", "same_machine", "ok"),
    [
        ([_row(0), _row(1), _row(2)], True, True, True),
        ([_row(0), _row(1, loss=1.5 + 1e-9), _row(2)], False, True, False),  # later only: the code changed
        ([_row(0, loss=1.5 * (1 + 1e-8)), _row(1, mean=0.52), _row(2)], False, False, True),  # another machine
        ([_row(0, loss=1.5 * (1 + 1e-4)), _row(1), _row(2)], False, False, False),  # round 0 too far off
        ([_row(0, loss=1.5 * (1 + 1e-8)), _row(1), _row(2, loss=float("nan"))], False, False, False),  # NaN moved
    ],
)
def test_match_record_tells_another_machine_from_another_code(rows, identical, same_machine, ok):
    import pandas as pd

    recorded = pd.DataFrame([_row(0), _row(1), _row(2)])
    match = benchmark.match_record({"status": "ok", "rows": rows}, recorded)
    assert (match["identical"], match["same_machine"], match["ok"]) == (identical, same_machine, ok)
    assert bool(match["why"]) == (not ok)
    assert not benchmark.match_record({"status": "ok", "rows": rows[:2]}, recorded)["ok"]  # other rounds


def test_replay_runs_with_the_kernels_it_is_asked_for(result):
    import torch

    config = {**json.loads(_first(result, "fedavg").config), "rounds": 2}
    here = torch.backends.cpu.get_cpu_capability()
    (same,) = benchmark.replay([config])  # this process's kernels: run here
    (again,) = benchmark.replay([config], cpu_capability=here.lower())  # the same, named
    (plain,) = benchmark.replay([config], cpu_capability="DEFAULT")  # no vector kernels: in a child
    assert same["cpu_capability"] == again["cpu_capability"] == here and plain["cpu_capability"] == "DEFAULT"
    direct = benchmark.execute(config)
    assert [r["round"] for r in plain["rows"]] == [r["round"] for r in direct["rows"]] == [0, 1, 2]
    for column in COLUMNS:
        mine = np.array([row[column] for row in direct["rows"]], dtype=float)
        assert np.array_equal(mine, [row[column] for row in same["rows"]], equal_nan=True), column
    for column in ("loss", "train_loss"):  # other kernels: other last bits (an accuracy may flip a prediction)
        mine = np.array([row[column] for row in direct["rows"]], dtype=float)
        assert np.allclose(mine, [row[column] for row in plain["rows"]], rtol=1e-5, equal_nan=True), column


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: benchmark.replay(5), "configs"),
        (lambda: benchmark.replay([{}, 5]), r"configs\[1\]"),
        (lambda: benchmark.replay([], cpu_capability=2), "cpu_capability"),
        (lambda: benchmark.replay([], root=3), "root"),
    ],
)
def test_replay_names_a_bad_argument(call, name):
    with pytest.raises(TypeError, match=name):
        call()


def test_replay_says_when_its_child_process_fails(result, monkeypatch):
    import sys

    import torch

    other = "DEFAULT" if torch.backends.cpu.get_cpu_capability() != "DEFAULT" else "AVX2"
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="replay's child process failed"):
        benchmark.replay([json.loads(_first(result, "fedavg").config)], cpu_capability=other)


def test_the_builder_has_no_name_special_cases_but_conditional():
    import inspect

    source = inspect.getsource(execution._strategy)
    assert not any(f'"{name}"' in source for name in SPECIAL)
    with pytest.raises(TypeError, match="local takes no argument 'server_lr'"):
        execution._strategy({"builder": "local", "settings": {"server_lr": 1.0}}, None)


TINY_RUN = dict(
    progress=False,
    num_clients=6,
    rounds=1,
    clients_per_round=3,
    batch_size=32,
    last_k=1,
    tuning_seeds=(0,),
    eval_seeds=(1, 2),
)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A user's strategy module in tmp_path, imported (the registry restored afterwards)."""
    import importlib

    with restored_registry():
        yield importlib.import_module(
            write_user_module(tmp_path, monkeypatch, "bench_plugin_strategies", "halvedbench")
        )


def test_a_users_registered_strategy_runs_in_the_benchmark_by_name(plugin, tmp_path):
    m = benchmark.Method("mine", strategy="halvedbench", tune={"server_lr": [2.0]})
    built = execution._strategy({"builder": m.builder(), "settings": {"server_lr": 2.0}}, None)
    assert type(built) is plugin.Halved and built.server_lr == 1.0
    r = benchmark.run([m], ["dirichlet:0.5"], out=tmp_path / "out", backend="sequential", **TINY_RUN)
    assert not r.failed and {"mine", "fedavg"} <= set(r.runs.method)
    assert set(r.runs[r.runs.method == "mine"].status) == {"ok"}


def test_a_users_registered_strategy_runs_in_worker_processes(plugin, tmp_path):
    """Failed before: a loky worker had not imported the user's module, so make_strategy did not know it."""
    m = benchmark.Method("mine", strategy="halvedbench", tune={"server_lr": [2.0]})
    r = benchmark.run([m], ["dirichlet:0.5"], out=tmp_path / "out", backend="joblib", n_jobs=2, **TINY_RUN)
    assert not r.failed, r.failure_report()
    assert set(r.runs[r.runs.method == "mine"].status) == {"ok"}


def test_method_by_name_builds_a_registered_strategy_tuned_as_fedavg(plugin):
    """Failed before: benchmark.method knew only the names of benchmark.METHODS."""
    m = benchmark.method("Halved-Bench")
    assert (m.name, m.strategy, m.tune) == ("halvedbench", "halvedbench", benchmark.METHODS["fedavg"].tune)
    with pytest.raises(ValueError, match="Unknown method 'nope'.*a registered strategy's name"):
        benchmark.method("nope")

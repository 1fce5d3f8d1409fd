"""fedlearn_edu.benchmark: the protocol, the statistics, resume after a kill, and the engines agree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedlearn_edu import benchmark
from fedlearn_edu.cli import main

ROOT = Path(__file__).resolve().parents[2]
# A tiny grid: 2 methods x 2 step candidates x 1 tuning seed + 2 x 2 evaluation seeds = 8 runs.
TINY = dict(
    methods=[
        benchmark.METHODS["fedavg"].with_tune(server_lr=[1.0, 2.0]),
        benchmark.METHODS["scaffold"].with_tune(server_lr=[0.5, 1.0]),
    ],
    federations=["dirichlet:0.5"],
    num_clients=4,
    num_samples=300,
    rounds=3,
    last_k=2,
    clients_per_round=2,
    tuning_seeds=(0,),
    eval_seeds=(1, 2),
    edge_cap=0,  # the grids as given (tests/benchmark/test_protocol.py tests the edge rule)
    progress=False,
)
TIMING = ["sec_per_round"]  # wall-clock: the one column that differs between identical runs


def _same(a: pd.DataFrame, b: pd.DataFrame):
    a, b = a.drop(columns=TIMING), b.drop(columns=TIMING)
    a = a.sort_values(["run_key", "round"]).reset_index(drop=True)
    b = b.sort_values(["run_key", "round"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    return benchmark.run(out=out, backend="sequential", **TINY)


def test_protocol_seeds_disjoint_and_recorded(reference):
    runs = reference.runs
    tune = set(runs[runs.phase == "tune"].seed)
    ev = set(runs[runs.phase == "eval"].seed)
    assert tune == {0} and ev == {1, 2} and not tune & ev
    assert (runs.status == "ok").all() and len(runs) == 8
    with pytest.raises(ValueError, match="disjoint"):
        benchmark.BenchmarkProtocol(tuning_seeds=(0, 1), eval_seeds=(1, 2))
    with pytest.raises(ValueError, match="at least 2"):
        benchmark.BenchmarkProtocol(eval_seeds=(1,))


def test_pick_is_the_best_tuning_candidate(reference):
    rec = reference.records
    tune = rec[(rec.phase == "tune") & (rec.method == "fedavg")]
    scores = {s: g.sort_values("round")["mean"].to_numpy()[-2:].mean() for s, g in tune.groupby("settings")}
    best = max(scores, key=scores.get)
    assert json.loads(best) == reference.picks[("dirichlet:0.5", "fedavg")]
    ev = rec[(rec.phase == "eval") & (rec.method == "fedavg")]
    assert set(ev.settings) == {best}


def test_records_are_tidy_with_every_setting(reference):
    rec = reference.records
    for col in (
        "method",
        "federation",
        "partition",
        "num_clients",
        "seed",
        "rounds",
        "lr",
        "param_server_lr",
        "round",
        "mean",
        "worst10",
        "std",
        "package_version",
        "git_commit",
        "phase",
    ):
        assert col in rec.columns, col
    assert len(rec) == 8 * 4  # rounds 0..3 per run
    assert rec.groupby("run_key").size().eq(4).all()
    assert (Path(reference.out) / "records.csv.gz").exists()
    loaded = benchmark.load(reference.out)
    _same(loaded.records, reference.records)
    configs = [json.loads(c) for c in loaded.runs.config]
    assert all(benchmark.run_key(c) == k for c, k in zip(configs, loaded.runs.run_key))


def test_summary_intervals_and_paired_difference_by_hand(reference):
    s = reference.summary()
    rec = reference.records[reference.records.phase == "eval"]

    def lastk(method):
        g = rec[rec.method == method]
        return np.array([g[g.seed == s].sort_values("round")["mean"].to_numpy()[-2:].mean() for s in (1, 2)])

    a, b = lastk("fedavg"), lastk("scaffold")
    row = s[s.method == "scaffold"].iloc[0]
    lo, hi = stats.t.interval(0.95, 1, loc=b.mean(), scale=stats.sem(b))
    assert row["lastk"] == pytest.approx(b.mean(), abs=1e-12)
    assert row["lastk_ci"] == pytest.approx((hi - lo) / 2, rel=1e-9)
    d = b - a
    assert row["d_lastk"] == pytest.approx(d.mean(), abs=1e-12)
    p = stats.ttest_rel(b, a).pvalue  # one comparison in the family: Holm leaves p as it is
    assert row["p_lastk"] == pytest.approx(p, rel=1e-9) and row["p_holm_lastk"] == pytest.approx(p, rel=1e-9)
    assert row["vs_lastk"] == ("inconclusive" if p >= 0.05 else ("better" if d.mean() > 0 else "worse"))
    assert s[s.method == "fedavg"].iloc[0]["vs_lastk"] == "baseline"


def test_t_interval_and_verdicts():
    m, h = benchmark.t_interval([1.0, 2.0, 3.0, 4.0])
    lo, hi = stats.t.interval(0.95, 3, loc=2.5, scale=stats.sem([1, 2, 3, 4]))
    assert m == 2.5 and h == pytest.approx((hi - lo) / 2)
    with pytest.raises(ValueError, match="at least 2"):
        benchmark.t_interval([1.0])
    # a hand-made summary: one clear win, one inconclusive difference (neither shown nor equivalent)
    rows = []
    for seed, (base, win, tie) in enumerate([(0.5, 0.7, 0.45), (0.6, 0.8, 0.7), (0.55, 0.76, 0.55)], start=1):
        for method, acc in (("fedavg", base), ("a", win), ("b", tie)):
            for r in range(3):
                rows.append(
                    dict(
                        phase="eval",
                        federation="f",
                        method=method,
                        seed=seed,
                        round=r,
                        mean=acc,
                        worst10=acc,
                        std=0.0,
                        sec_per_round=1.0,
                        settings="{}",
                        evaluated="global",
                    )
                )
    s = benchmark.summarize(pd.DataFrame(rows), benchmark.BenchmarkProtocol(rounds=3, last_k=2, target=0.75))
    verdict = dict(zip(s.method, s.vs_lastk))
    assert verdict == {"fedavg": "baseline", "a": "better", "b": "inconclusive"}
    reached = dict(zip(s.method, s.reached))
    assert reached == {"fedavg": 0, "a": 2, "b": 0}
    text = benchmark.format_results_table(s)
    assert "inconclusive" in text and "better" in text and "tie" not in text


def test_the_benchmark_table_and_the_histories_table_have_their_own_names():
    """Two format_table's (simulation's of histories, the benchmark's of a summary) and two _plain's were one name."""
    from fedlearn_edu import simulation
    from fedlearn_edu.benchmark import execution

    assert "History" in simulation.format_table.__doc__  # the chapters' call (ch05), unchanged
    assert not hasattr(benchmark, "format_table") and "format_results_table" in benchmark.__all__
    assert not hasattr(execution, "_plain") and execution._plain_record((np.int64(2), {1: np.float32(0.5)})) == [
        2,
        {"1": 0.5},
    ]


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="Unknown method 'nope'"):
        benchmark.run(["nope"], out="/nonexistent-never-created")
    with pytest.raises(ValueError, match="Unknown federation"):
        benchmark.parse_federation("zipf:2")
    with pytest.raises(ValueError, match="integer"):
        benchmark.parse_federation("shards:1.5")
    with pytest.raises(ValueError, match="n_jobs"):
        benchmark.run(["fedavg"], n_jobs=0, out="/nonexistent-never-created")
    with pytest.raises(ValueError, match="tune"):
        benchmark.Method("x", tune={"server_lr": []})


def test_resume_skips_done_and_redoes_corrupt(reference, tmp_path):
    out = tmp_path / "r"
    first = benchmark.run(out=out, backend="sequential", **TINY)
    runs = sorted((out / "runs").glob("*.csv"))
    runs[0].write_text(runs[0].read_text()[:-40])  # a truncated record
    (out / "runs" / f"{runs[1].stem}.json").write_text("{")  # a half-written manifest
    (out / "runs" / f"{runs[2].stem}.json").unlink()  # killed between the two writes
    again = benchmark.run(out=out, backend="sequential", **TINY)
    assert sorted(again.redone) == sorted(p.stem for p in runs[:3])
    _same(again.records, first.records)
    _same(again.records, reference.records)
    third = benchmark.run(out=out, backend="sequential", **TINY)
    assert third.redone == []
    assert list(third.records.sec_per_round) == list(again.records.sec_per_round)  # nothing was rerun


_CHILD = textwrap.dedent(
    """
    from fedlearn_edu import benchmark
    from tests.benchmark.test_sweep import TINY
    benchmark.run(out={out!r}, backend="sequential", **TINY)
    """
)


def test_killed_sweep_restarted_equals_uninterrupted(reference, tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    code = _CHILD.format(out=str(out))
    child = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list((out / "runs").glob("*.json"))) < 3:
            assert child.poll() is None, "the sweep finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    done = len(list((out / "runs").glob("*.json")))
    assert 3 <= done < 8
    assert not (out / "records.csv.gz").exists()
    restarted = benchmark.run(out=out, backend="sequential", **TINY)
    _same(restarted.records, reference.records)


def _broken(**settings):
    raise RuntimeError("this method always fails")


def test_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    bad = benchmark.Method("broken", factory=_broken, tune={"server_lr": [1.0]})
    grid = {**TINY, "methods": [TINY["methods"][0], bad]}
    result = benchmark.run(out=tmp_path, backend="sequential", **grid)
    failed = result.runs[result.runs.status == "failed"]
    assert set(failed.method) == {"broken"} and "always fails" in failed.error.iloc[0]
    assert (result.runs[result.runs.method == "fedavg"].status == "ok").all()
    report = result.failure_report()
    assert "broken" in report and "Rerun the same command" in report
    assert list(result.summary().method) == ["fedavg"]


def test_engines_agree_joblib_and_dask_localcluster(reference, tmp_path):
    from distributed import Client, LocalCluster

    joblib_run = benchmark.run(out=tmp_path / "joblib", backend="joblib", n_jobs=2, **TINY)
    _same(joblib_run.records, reference.records)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        dask_run = benchmark.run(out=tmp_path / "dask", dask_client=client, **TINY)
        assert len(client.scheduler_info()["workers"]) == 2
    _same(dask_run.records, reference.records)


def test_cli_benchmark_writes_everything(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = [
        "benchmark",
        "--methods",
        "fedavg,craft",
        "--partitions",
        "shards:2",
        "--clients",
        "4",
        "--num-samples",
        "300",
        "--rounds",
        "3",
        "--last-k",
        "2",
        "--seeds",
        "2",
        "--tune-seeds",
        "1",
        "--edge-cap",
        "0",
        "--clients-per-round",
        "2",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "craft" in text and "+-" in text
    for name in ("records.csv.gz", "runs.csv", "summary.csv", "report.md", "curves.png", "intervals.png"):
        assert (out / name).exists(), name
    assert "| craft |" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--methods", "fedavg,nope"], "argument --methods: Unknown method 'nope'"),
        (["--partitions", "dirichlet:-1"], "argument --partitions"),
        (["--seeds", "1"], "argument --seeds"),
        (["--margin", "0"], "argument --margin"),
        (["--edge-cap", "-1"], "argument --edge-cap"),
        (["--rounds", "3", "--last-k", "5"], "argument --last-k"),
        (["--jobs", "2", "--dask-scheduler", "tcp://127.0.0.1:1"], "argument --jobs"),
    ],
)
def test_cli_bad_flags_exit_2(flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["benchmark", "--out", str(tmp_path / "x"), *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    names = ",".join(sorted(benchmark.METHODS))  # the --methods error lists them all: not counted
    assert message in err[-1] and len(err[-1].replace(names, "")) < 400
    assert not (tmp_path / "x").exists()

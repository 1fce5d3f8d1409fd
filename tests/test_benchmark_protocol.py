"""The benchmark's protocol: the edge rule, several tuning seeds, refusals, old records, the report."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from fedlearn_edu import benchmark

ROUNDS = 4


def _synthetic(peak: float):
    """An ``execute`` whose accuracy peaks at ``server_lr = peak`` (log scale), with seed noise."""

    def execute(config, factory=None, root=None):
        lr = config["settings"]["server_lr"]
        noise = 0.001 * ((config["seed"] * 7919) % 13) / 13
        acc = 0.9 - 0.05 * (math.log2(lr) - math.log2(peak)) ** 2 + noise
        if config["method"] == "better":
            acc += 0.05 + 0.002 * (config["seed"] % 3)
        rows = [
            {
                "round": r,
                "mean": acc * r / ROUNDS,
                "std": 0.1,
                "worst10": acc * r / ROUNDS - 0.2,
                "best10": 1.0,
                "loss": 1.0,
                "train_loss": 1.0,
            }
            for r in range(ROUNDS + 1)
        ]
        return {"status": "ok", "rows": rows, "seconds": 0.0, "evaluated": "global"}

    return execute


def _run(monkeypatch, tmp_path, peak, methods=None, **kw):
    monkeypatch.setattr(benchmark, "execute", _synthetic(peak))
    methods = methods or [benchmark.Method("fedavg", tune={"server_lr": [1.0, 2.0, 4.0]})]
    kw = {"rounds": ROUNDS, "last_k": 2, "tuning_seeds": (0, 1, 2), "eval_seeds": tuple(range(3, 9)), **kw}
    return benchmark.run(methods, ["dirichlet:0.1"], out=tmp_path, engine="sequential", progress=False, **kw)


@pytest.mark.parametrize(
    "peak, grid", [(16.0, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]), (0.25, [0.125, 0.25, 0.5, 1.0, 2.0, 4.0])]
)
def test_the_edge_rule_finds_a_best_step_outside_the_first_grid(monkeypatch, tmp_path, peak, grid):
    r = _run(monkeypatch, tmp_path, peak)
    pair = ("dirichlet:0.1", "fedavg")
    assert r.picks[pair] == {"server_lr": peak}
    assert r.grids[pair]["server_lr"] == grid  # extended x2 / /2 until the pick was inside
    assert pair not in r.edges
    proto = json.loads((tmp_path / "protocol.json").read_text())
    assert proto["record_version"] == benchmark.RECORD_VERSION
    entry = next(p for p in proto["picks"] if p["method"] == "fedavg")
    assert entry["grid"] == {"server_lr": grid} and entry["edge"] == {}
    tuned = r.runs[r.runs.phase == "tune"]
    assert len(tuned) == len(grid) * 3 and set(tuned.seed) == {0, 1, 2}  # every candidate on every tuning seed


def test_a_pick_at_the_cap_is_flagged(monkeypatch, tmp_path):
    r = _run(monkeypatch, tmp_path, 64.0, edge_cap=2)
    pair = ("dirichlet:0.1", "fedavg")
    assert r.grids[pair]["server_lr"] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert r.picks[pair] == {"server_lr": 16.0} and r.edges[pair] == {"server_lr": "high"}
    assert r.summary().set_index("method").loc["fedavg", "edge"] == "server_lr high"
    assert "at the edge: server_lr high" in benchmark.markdown_report(r)
    assert benchmark.load(tmp_path).edges == r.edges


def test_edge_rule_off_and_settings_it_does_not_extend(monkeypatch, tmp_path):
    r = _run(monkeypatch, tmp_path, 16.0, edge_cap=0)
    assert r.grids[("dirichlet:0.1", "fedavg")]["server_lr"] == [1.0, 2.0, 4.0]
    m = benchmark.Method("x", strategy="fedavgm", tune={"effective_lr": [1.0, 2.0], "momentum": [0.5, 0.9]})
    assert m.extend == ("effective_lr",)  # a bounded setting is never extended
    with pytest.raises(ValueError, match="not tuned"):
        benchmark.Method("x", tune={"server_lr": [1.0, 2.0]}, extend=("mu",))
    with pytest.raises(ValueError, match="positive numbers"):
        benchmark.Method("x", tune={"server_lr": [0.0, 1.0]})


def test_verdicts_are_corrected_and_counted(monkeypatch, tmp_path):
    methods = [
        benchmark.Method("fedavg", tune={"server_lr": [1.0, 2.0, 4.0]}),
        benchmark.Method("better", strategy="fedavg", tune={"server_lr": [1.0, 2.0, 4.0]}),
        benchmark.Method("same", strategy="fedavg", tune={"server_lr": [1.0, 2.0, 4.0]}),
    ]
    r = _run(monkeypatch, tmp_path, 2.0, methods=methods)
    s = r.summary().set_index("method")
    assert s.loc["better", "vs_lastk"] == "better" and s.loc["better", "p_holm_lastk"] < 0.05
    assert s.loc["same", "vs_lastk"] == "equivalent"  # bitwise FedAvg: the TOST passes
    assert s.loc["better", "p_holm_lastk"] >= s.loc["better", "p_lastk"]
    c = benchmark.verdict_counts(s.reset_index())
    assert c["better"] >= 1 and c["tests"] == c["better"] + c["worse"] + c["equivalent"] + c["inconclusive"]
    report = benchmark.markdown_report(r)
    assert "Power:" in report and "after Holm" in report


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tuning_seeds=(0, 1), eval_seeds=(1, 2)), "disjoint"),
        (dict(eval_seeds=(5,)), "at least 2"),
        (dict(margin=0.0), "margin"),
        (dict(margin=-0.02), "margin"),
        (dict(margin=True), "margin"),
        (dict(alpha=1.0), "alpha"),
        (dict(edge_cap=-1), "edge_cap"),
        (dict(edge_cap=True), "edge_cap"),
    ],
)
def test_bad_protocols_are_refused_with_one_clear_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        benchmark.Protocol(**kwargs)
    assert "\n" not in str(err.value)


def test_default_protocol_tunes_on_three_seeds_and_evaluates_on_ten():
    p = benchmark.Protocol()
    assert len(p.tuning_seeds) == 3 and len(p.eval_seeds) == 10 and not set(p.tuning_seeds) & set(p.eval_seeds)


def test_records_of_version_1_are_converted_and_unknown_versions_refused(tmp_path):
    old = benchmark.REPO_RECORDS.parent / "robust"
    proto = json.loads((old / "protocol.json").read_text())
    if proto.get("record_version", 1) != 1:  # the committed grid was regenerated: make a version-1 copy
        for name in benchmark.RECORD_FILES:
            shutil.copy(old / name, tmp_path / name)
        proto.pop("record_version")
        for p in proto["picks"]:
            p.pop("grid", None), p.pop("edge", None)
        (tmp_path / "protocol.json").write_text(json.dumps(proto))
        old = tmp_path
    r = benchmark.load(old)
    assert r.record_version == 1 and r.grids == {} and r.edges == {}
    s = r.summary()
    assert {"p_holm_lastk", "q_lastk", "tost_lastk", "vs_lastk"} <= set(s.columns)
    assert set(s.vs_lastk) <= {"baseline", "untested", *benchmark.VERDICTS}
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in benchmark.RECORD_FILES:
        shutil.copy(old / name, bad / name)
    (bad / "protocol.json").write_text(json.dumps({**proto, "record_version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        benchmark.load(bad)


def test_power_column_is_the_family_corrected_detectable_difference(monkeypatch, tmp_path):
    from fedlearn_edu import stats

    methods = [
        benchmark.Method("fedavg", tune={"server_lr": [1.0, 2.0, 4.0]}),
        benchmark.Method("better", strategy="fedavg", tune={"server_lr": [1.0, 2.0, 4.0]}),
    ]
    s = _run(monkeypatch, tmp_path, 2.0, methods=methods).summary().set_index("method")
    row = s.loc["better"]
    expected = stats.min_detectable_difference(row.sd_lastk, int(row.n_lastk), 0.05, 0.8, 1)
    assert row.mdd_lastk == pytest.approx(expected) and np.isfinite(row.p_perm_lastk)


def test_methods_for_gives_a_federation_its_own_methods(monkeypatch, tmp_path):
    monkeypatch.setattr(benchmark, "execute", _synthetic(2.0))
    methods = [
        benchmark.Method(n, strategy="fedavg", tune={"server_lr": [1.0, 2.0, 4.0]}) for n in ("fedavg", "better", "b")
    ]
    r = benchmark.run(
        methods[:2],
        ["dirichlet:0.1", "shards:2"],
        methods_for={"shards:2": [methods[2]]},  # FedAvg joins as the baseline
        out=tmp_path,
        engine="sequential",
        progress=False,
        rounds=ROUNDS,
        last_k=2,
        tuning_seeds=(0, 1, 2),
        eval_seeds=(3, 4, 5),
    )
    cells = {("dirichlet:0.1", "fedavg"), ("dirichlet:0.1", "better"), ("shards:2", "fedavg"), ("shards:2", "b")}
    assert set(r.picks) == cells and set(r.grids) == cells
    assert set(zip(r.runs.federation, r.runs.method)) == cells  # nothing ran outside the cells
    assert set(zip(r.summary().federation, r.summary().method)) == cells
    assert "  -  " in r.table() or r.table().rstrip().endswith("-")  # an absent cell reads '-', not 'failed'
    assert "failed" not in r.table()
    report = benchmark.markdown_report(r)
    assert "| better | " in report and report.split("| better | ")[1].split("\n")[0].rstrip(" |").endswith("-")
    assert "No run failed." in report and "| failed" not in report
    assert "a family of 1 comparisons" in report  # each federation compares one method with FedAvg
    with pytest.raises(ValueError, match="not a federation of the grid"):
        benchmark.run(methods, ["dirichlet:0.1"], methods_for={"shards:2": ["fedavg"]}, out=tmp_path / "x")


def test_cli_methods_for_refuses_a_federation_not_in_partitions(capsys, tmp_path):
    from fedlearn_edu.cli import main

    with pytest.raises(SystemExit) as exc:
        main(
            ["benchmark", "--partitions", "dirichlet:0.1", "--methods-for", "clusters:4=ditto", "--out", str(tmp_path)]
        )
    assert exc.value.code == 2
    assert "--methods-for: 'clusters:4=ditto' is not FEDERATION=METHODS" in capsys.readouterr().err

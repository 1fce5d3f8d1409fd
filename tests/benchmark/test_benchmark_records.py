"""The committed benchmark grids (benchmarks/results/classroom, .../robust, .../lab) still match the code.

The comparison chapter and the chapter *When clients misbehave* read these records instead of
running their grids. Here a sample of runs other than the chapters' is run again from its
recorded configuration, with the CPU kernels the records were computed with
(``benchmark.replay``), and every recorded number must come out identical, bit for bit: a change
to the code that changes the results fails this test, and the records are then regenerated with
the command in their README. On a machine whose arithmetic differs from the records' already in
round 0 (another vendor's BLAS code path), ``benchmark.match_record`` asks round 0 to agree to
``benchmark.START_RTOL`` and the failures to sit in the same places instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlearn_edu import benchmark
from tests.needs_data import require_fashion_mnist

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RECORDS = RESULTS / "classroom"
COLUMNS = ("mean", "std", "worst10", "best10", "loss", "train_loss")
# per grid: the methods the re-run sample is drawn from (quick ones), its seed, not the chapter's
# (chapter 9 draws with seed 2026, chapter 10 with 2027), and how many runs (a lab run is 100 rounds
# of Fashion-MNIST with 100 clients, about 25 s on one core)
SAMPLES = {
    "classroom": (("fedavgm", "fednova", "fedprox", "fedadam", "qfedavg", "fedfv"), 21, 3),
    "robust": (("trimmedmean", "krum", "normclipping", "dp0.3", "centeredclipping"), 22, 3),
    "lab": (("fedavg", "fedadam", "fedoui"), 23, 1),
}


@pytest.fixture(scope="module")
def result():
    return benchmark.load(RECORDS)


@pytest.fixture(scope="module", params=sorted(SAMPLES))
def grid(request):
    return request.param, benchmark.load(RESULTS / request.param)


@pytest.mark.slow
def test_the_records_follow_the_protocol(result):
    runs, p = result.runs, result.protocol
    assert result.record_version == benchmark.RECORD_VERSION
    assert (runs[runs.phase == "eval"].status == "ok").all()  # a tuning run may fail (a step too large)
    assert not set(p.tuning_seeds) & set(p.eval_seeds)
    assert len(p.tuning_seeds) >= 3 and len(p.eval_seeds) >= 10
    ev = runs[runs.phase == "eval"]
    assert (ev.groupby(["federation", "method"]).seed.nunique() == len(p.eval_seeds)).all()
    configs = [json.loads(c) for c in runs.config]
    assert [benchmark.run_key(c) for c in configs] == list(runs.run_key)  # the keys hash the configs
    methods = [benchmark.METHODS[m] for m in dict.fromkeys(runs.method)]
    feds = [benchmark.parse_federation(f, **_common(configs[0])) for f in dict.fromkeys(runs.federation)]
    tune = result.records[result.records.phase == "tune"]
    assert benchmark.select(tune, methods, feds, p, result.grids) == result.picks  # picks follow from the runs
    tried = runs[runs.phase == "tune"]  # failed runs included: they are in runs.csv, not in the records
    for (f, m), grid in result.grids.items():  # every candidate of the final grids ran on every tuning seed
        mine = tried[(tried.federation == f) & (tried.method == m)]
        for k, values in grid.items():
            done = {json.loads(c)["settings"][k] for c in mine.config}
            assert len(grid[k]) < 2 or done == set(values), (f, m, k)
    for key, cfg in zip(runs.run_key, configs):
        if cfg["phase"] == "eval":
            assert cfg["settings"] == result.picks[(cfg["federation"]["name"], cfg["method"])], key


def _common(cfg):
    fed = cfg["federation"]
    return {"dataset": fed["dataset"], "num_clients": fed["num_clients"], "model": fed["model"]}


def test_the_summary_follows_from_the_records(grid):
    name, result = grid
    committed = pd.read_csv(RESULTS / name / "summary.csv").fillna({"edge": ""})  # no edge flag: an empty cell
    again = result.summary()
    drop = [c for c in committed.columns if c.startswith("sec_per_round")]
    # mdd_*: a root of the power of the noncentral t, whose values scipy's releases compute differently
    # in the last digits (1.11 vs 1.17: 2e-9 relative); every other number is exact arithmetic on the records
    mdd = [c for c in committed.columns if c.startswith("mdd_")]
    pd.testing.assert_frame_equal(
        committed.drop(columns=drop + mdd).reset_index(drop=True),
        again.drop(columns=drop + mdd).reset_index(drop=True),
        check_dtype=False,
        rtol=1e-12,
    )
    pd.testing.assert_frame_equal(committed[mdd], again[mdd], check_dtype=False, rtol=1e-6)


@pytest.mark.records
def test_a_sample_of_runs_is_reproduced(grid):
    name, result = grid
    methods, seed, size = SAMPLES[name]
    runs = result.runs
    light = runs[runs.method.isin(methods) & (runs.status == "ok")]
    sample = light.iloc[np.sort(np.random.default_rng(seed).choice(len(light), size=size, replace=False))]
    if any(json.loads(c)["federation"]["dataset"] == "fashion_mnist" for c in sample.config):
        require_fashion_mnist()  # the lab grid: skips, saying why, without it (fails in .ci/run)
    lives = benchmark.replay([json.loads(c) for c in sample.config], cpu_capability=benchmark.RECORDS_CPU_CAPABILITY)
    for (_, run), live in zip(sample.iterrows(), lives):
        assert live["status"] == "ok", live.get("error")
        assert live["cpu_capability"] == benchmark.RECORDS_CPU_CAPABILITY  # x86-64: every such CPU has AVX2
        rec = result.records[result.records.run_key == run.run_key]
        match = benchmark.match_record(live, rec, COLUMNS)
        # bit for bit where this machine's arithmetic is the records' (round 0 says so); else round 0 to
        # START_RTOL and the failures in the same places (benchmark.match_record)
        assert match["ok"], (run.method, run.run_key, match["why"])


# --------------------------------------------------------------------------- what README.md says of the grids

README = RESULTS.parents[1] / "README.md"
_NUM = r"([+-]?\d+\.\d)"
_P = r"([0-9.e+-]+)"


def _readme_says(pattern: str) -> re.Match:
    text = " ".join(README.read_text(encoding="utf-8").split())
    found = re.search(pattern, text)
    assert found, f"README.md no longer says {pattern!r}: change the README and this test together"
    return found


def test_the_readme_states_craft_on_dirichlet_skew_as_its_example_computes_it(result):
    """The README's example (FedAvg and CRAFT on dirichlet:0.1, the default ten evaluation seeds) is a
    part of the classroom grid: the same keys, so its numbers follow from the grid's records."""
    said = _readme_says(
        rf"CRAFT's last-5 mean accuracy minus FedAvg's is {_NUM} \+- {_NUM} points over the ten seeds "
        rf"\(p = {_P}\), \*\*(\w+)\*\*"
    )
    seeds = benchmark.BenchmarkProtocol().eval_seeds  # benchmark.run's default, which the example uses
    assert len(seeds) == 10
    rec = result.records
    part = rec[
        (rec.phase == "eval")
        & (rec.federation == "dirichlet:0.1")
        & rec.method.isin(["fedavg", "craft"])
        & rec.seed.isin(seeds)
    ]
    row = benchmark.summarize(part, result.protocol).set_index("method").loc["craft"]
    assert said.groups() == (
        f"{100 * row.d_lastk:+.1f}",
        f"{100 * row.d_lastk_ci:.1f}",
        f"{row.p_holm_lastk:.2g}",
        row.vs_lastk,
    )


def test_the_readme_states_craft_on_the_shards_as_the_grids_give_it():
    said = _readme_says(
        rf"the chapter's classroom grid, over its (\d+) evaluation seeds, finds CRAFT \*\*(\w+)\*\* than FedAvg: "
        rf"{_NUM} \+- {_NUM} points \(Holm-adjusted p = {_P}\), as are (\d+) other methods with one global model "
        rf"\(FedAvgM among them\); at the lab grid's scale \(Fashion-MNIST, (\d+) clients, (\d+) rounds\) the "
        rf"difference on the shards is {_NUM} \+- {_NUM} points, \*\*(\w+)\*\* \(Holm-adjusted p = {_P}\)"
    )
    (n, word, d, h, p, others, clients, rounds, lab_d, lab_h, lab_word, lab_p) = said.groups()
    grids = {g: pd.read_csv(RESULTS / g / "summary.csv") for g in ("classroom", "lab")}  # see the summary test above
    cell = {g: s.set_index(["federation", "method"]) for g, s in grids.items()}
    craft = cell["classroom"].loc[("shards:2", "craft")]
    assert (n, word, d, h, p) == (
        str(craft.n_seeds),
        craft.vs_lastk,
        f"{100 * craft.d_lastk:+.1f}",
        f"{100 * craft.d_lastk_ci:.1f}",
        f"{craft.p_holm_lastk:.2g}",
    )
    shards = grids["classroom"][(grids["classroom"].federation == "shards:2")]
    same = shards[(shards.evaluated == "global") & (shards.vs_lastk == craft.vs_lastk) & (shards.method != "craft")]
    assert int(others) == len(same) and "fedavgm" in set(same.method)
    lab = cell["lab"].loc[("shards:2", "craft")]
    assert (lab_d, lab_h, lab_word, lab_p) == (
        f"{100 * lab.d_lastk:+.1f}",
        f"{100 * lab.d_lastk_ci:.1f}",
        lab.vs_lastk,
        f"{lab.p_holm_lastk:.2g}",
    )
    lab_protocol = json.loads((RESULTS / "lab" / "protocol.json").read_text())
    lab_config = json.loads(pd.read_csv(RESULTS / "lab" / "runs.csv", nrows=1).config.iloc[0])
    assert (int(clients), int(rounds)) == (lab_config["federation"]["num_clients"], lab_protocol["rounds"])
    assert lab_config["federation"]["dataset"] == "fashion_mnist"

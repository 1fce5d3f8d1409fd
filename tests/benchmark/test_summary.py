"""summarize(): failed runs as outcomes, the exact test's confirmation, differences inside the margin."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from fedlearn_edu import benchmark, stats

SEEDS = list(range(3, 13))


def _records(acc: dict, rounds: int = 5) -> pd.DataFrame:
    """Tidy evaluation records: ``acc[(federation, method)] = {seed: accuracy}``, flat over the rounds."""
    rows = []
    for (fed, meth), per_seed in acc.items():
        for seed, a in per_seed.items():
            for t in range(1, rounds + 1):
                rows.append(
                    {
                        "phase": "eval",
                        "federation": fed,
                        "method": meth,
                        "settings": "{}",
                        "seed": seed,
                        "round": t,
                        "mean": a,
                        "worst10": a - 0.1,
                        "std": 0.05,
                        "sec_per_round": 0.1,
                        "evaluated": "global",
                    }
                )
    return pd.DataFrame(rows)


def _grid(gain: float, spread: float, methods=("a", "b"), seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    base = {s: float(0.7 + 0.02 * rng.standard_normal()) for s in SEEDS}
    acc = {("f", "fedavg"): base}
    for m in methods:
        acc[("f", m)] = {s: float(base[s] + gain + spread * rng.standard_normal()) for s in SEEDS}
    return acc


def test_a_failed_run_is_counted_and_scored_as_chance_in_the_check():
    acc = _grid(0.0, 0.01)
    failed_seeds = (3, 4, 5, 7, 9, 10, 12)
    for s in failed_seeds:
        del acc[("f", "a")][s]
    s = benchmark.summarize(_records(acc), failures=[("f", "a", x) for x in failed_seeds], chance=0.1)
    row = s.set_index("method").loc["a"]
    assert row.n_failed == 7 and row.n_seeds == 3
    assert row.fail_rate == pytest.approx(0.7)
    # the primary verdict is over the complete pairs; the check scores the failures at chance
    assert row.n_lastk == 3
    base = acc[("f", "fedavg")]
    mine = {**acc[("f", "a")], **dict.fromkeys(failed_seeds, 0.1)}
    d = np.array([mine[x] - base[x] for x in SEEDS])
    assert row.d_chance_lastk == pytest.approx(d.mean(), rel=1e-12)
    assert row.p_chance_lastk == pytest.approx(stats.sign_flip_p(d), rel=1e-12)
    assert row.vs_chance_lastk == "worse"  # seven seeds lost by ~60 points, three tied
    notes = benchmark.verdict_notes(row, "lastk")
    assert notes["failures"] == "7 of 10 runs failed"
    assert row.vs_exact_lastk == "untested"  # three finished seeds: too few for the exact test
    # without the chance level, a pair with failures has no check; without failures, no note
    unknown = benchmark.summarize(_records(acc), failures=[("f", "a", x) for x in failed_seeds])
    assert unknown.set_index("method").loc["a"].vs_chance_lastk == "untested"
    other = s.set_index("method").loc["b"]
    assert other.n_failed == 0 and other.fail_rate == 0.0
    assert "failures" not in benchmark.verdict_notes(other, "lastk")


def test_the_exact_verdicts_are_holm_over_permutation_tests_computed_independently():
    result = benchmark.load(benchmark.records_folder("lab"))
    s = result.summary()
    for metric in ("lastk", "worst10"):
        for fed, family in s[s.method != "fedavg"].groupby("federation", sort=False):
            family = family[np.isfinite(family[f"p_perm_{metric}"])]
            p = []
            for r in family.itertuples():
                ev = result.records[(result.records.phase == "eval") & (result.records.federation == fed)]
                per = {
                    m: ev[ev.method == m]
                    .groupby("seed")[{"lastk": "mean", "worst10": "worst10"}[metric]]
                    .apply(lambda x: x.to_numpy()[-result.protocol.last_k :].mean())
                    for m in (r.method, "fedavg")
                }
                common = sorted(set(per[r.method].index) & set(per["fedavg"].index))
                d = per[r.method][common].to_numpy() - per["fedavg"][common].to_numpy()
                test = sps.permutation_test(
                    (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
                )
                p.append(test.pvalue)
            # Holm by hand: step-down, monotone, capped at 1
            order = np.argsort(p)
            adjusted, running = np.empty(len(p)), 0.0
            for rank, i in enumerate(order):
                running = max(running, (len(p) - rank) * p[i])
                adjusted[i] = min(1.0, running)
            np.testing.assert_allclose(family[f"p_perm_holm_{metric}"], adjusted, rtol=1e-9)
            for r, q in zip(family.itertuples(), adjusted):
                expected = stats.verdict(getattr(r, f"d_{metric}"), q, getattr(r, f"tost_holm_{metric}"))
                assert getattr(r, f"vs_exact_{metric}") == expected, (fed, r.method)


def test_the_lab_grids_unconfirmed_and_within_margin_verdicts():
    s = benchmark.load(benchmark.records_folder("lab")).summary().set_index(["federation", "method"])
    momentum = s.loc[("noisy:0.8", "fedavgm")]
    assert momentum.vs_lastk == "better" and momentum.vs_exact_lastk == "equivalent"
    notes = benchmark.verdict_notes(momentum, "lastk")
    assert list(notes) == ["not_confirmed", "within_margin", "edge"]
    assert s.loc[("shards:2", "fedvg")].within_margin_lastk
    assert s.loc[("clusters:4", "conditional")].within_margin_lastk
    assert not s.loc[("dirichlet:0.1", "feddyn")].within_margin_lastk  # +8.4 points: far past the margin
    assert s.loc[("shards:2", "scaffold")].n_failed == 2


def test_a_difference_inside_the_margin_can_be_better_and_equivalent_at_once():
    acc = _grid(0.005, 0.001)
    s = benchmark.summarize(_records(acc)).set_index("method")
    assert s.loc["a", "vs_lastk"] == "better" and s.loc["a", "tost_holm_lastk"] < 0.05
    assert s.loc["a", "within_margin_lastk"]
    far = benchmark.summarize(_records(_grid(0.1, 0.001))).set_index("method")
    assert far.loc["a", "vs_lastk"] == "better" and not far.loc["a", "within_margin_lastk"]


def test_failures_and_chance_are_checked():
    acc = _records(_grid(0.0, 0.01))
    with pytest.raises(ValueError, match="triple"):
        benchmark.summarize(acc, failures=[("f", "a")])
    with pytest.raises(TypeError, match="failures"):
        benchmark.summarize(acc, failures="f,a,3")
    with pytest.raises(ValueError, match="chance"):
        benchmark.summarize(acc, chance=1.5)


def test_reached_share_is_the_share_of_seeds_that_reach_the_target():
    acc = _grid(0.0, 0.01)
    acc[("f", "a")] = {s: (0.9 if s < 8 else 0.5) for s in SEEDS}  # 5 of 10 reach 0.8
    s = benchmark.summarize(_records(acc), benchmark.BenchmarkProtocol(target=0.8)).set_index("method")
    assert s.loc["a", "reached_share"] == 0.5
    assert s.loc["fedavg", "reached_share"] == 0.0
    assert math.isnan(s.loc["a", "p_rounds_to_target"])  # tested only where both reach it on every seed


@pytest.mark.parametrize(
    ("p", "text"), [(0.0496, "0.0496"), (0.0504, "0.05"), (0.012345, "0.012"), (3.8e-8, "3.8e-08")]
)
def test_p_values_are_printed_so_that_the_five_percent_line_is_never_crossed_by_rounding(p, text):
    assert stats.format_p(p) == text


def test_the_forest_plot_marks_unconfirmed_verdicts_edges_and_failures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = benchmark.load(benchmark.records_folder("lab")).summary()
    fig = benchmark.plot_intervals(s, "lastk", margin=0.02)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == list(dict.fromkeys(s.federation))
    noisy = panels[[ax.get_title() for ax in panels].index("noisy:0.8")]
    hollow = [line for line in noisy.lines if line.get_markerfacecolor() == "white"]
    assert len(hollow) == 1  # FedAvgM, the one better/worse there the exact test does not confirm
    marks = {t.get_text() for ax in panels for t in ax.texts}
    assert benchmark.MARKS["edge"] in marks and any(m.startswith(benchmark.MARKS["failures"]) for m in marks)
    assert any(benchmark.MARKS["within_margin"] in m for m in marks)
    plt.close(fig)
    fig = benchmark.plot_verdict_map(s, "lastk")
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert len(cells) == len(s) and cells.count("FedAvg") == s.federation.nunique()
    assert any(benchmark.MARKS["not_confirmed"] in c for c in cells)
    plt.close(fig)


def test_the_verdict_table_reads_every_cell_in_full():
    s = benchmark.load(benchmark.records_folder("lab")).summary()
    table = benchmark.verdict_table(s, "lastk")
    assert list(table.columns) == list(dict.fromkeys(s.federation)) and list(table.index) == list(
        dict.fromkeys(s.method)
    )
    scaffold = table.loc["scaffold", "shards:2"]
    assert scaffold.startswith("71.7 +- 2.8; -2.0 +- 1.9, inconclusive, p=0.093")
    assert benchmark.MARKS["failures"] + "2" in scaffold and benchmark.MARKS["failures_change"] in scaffold
    assert table.loc["fedvg", "clusters:4"] == "-"  # not run there
    assert "% of seeds reach it" in benchmark.verdict_table(s, "rounds_to_target").loc["fedavg", "shards:2"]
    with pytest.raises(ValueError, match="metric"):
        benchmark.verdict_table(s, "std")

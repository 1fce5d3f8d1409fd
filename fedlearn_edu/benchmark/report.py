"""Plots and the Markdown report of a :class:`~fedlearn_edu.benchmark.BenchmarkResult`."""

from __future__ import annotations

import json
import math

import numpy as np

from ..checks import check_instance, check_range
from ..stats import VERDICTS
from .execution import VALUE_COLUMNS, _version
from .results import BenchmarkResult
from .summary import GUIDE_METRICS, NOTHING_FINISHED, TESTED_METRICS, _check_metrics


def plot_curves(result: BenchmarkResult, metrics=("mean", "worst10"), methods=None, confidence: float = 0.95):
    """Per federation (columns) and metric (rows): the evaluation runs' curves over rounds.

    Each method's curve is the mean over the evaluation seeds with its t-interval as a band.

    Args:
        result: a :class:`BenchmarkResult`.
        metrics: record columns to plot, one row of panels each (fractions in ``[0, 1]``).
        methods: the methods to draw (``None``: all, in the grid's order).
        confidence: the level of the bands.

    Returns:
        The matplotlib figure, ``len(metrics)`` x number of federations panels.

    Raises:
        TypeError: ``result`` is not a :class:`BenchmarkResult`, ``confidence`` not a number.
        ValueError: no evaluation run finished (nothing to draw: see
            :meth:`BenchmarkResult.failure_report`), or a metric that is not a record column of
            :data:`VALUE_COLUMNS`.
    """
    import matplotlib.pyplot as plt
    from scipy import stats

    metrics = _check_metrics(metrics, VALUE_COLUMNS[1:])
    check_instance(result, "result", BenchmarkResult, "a benchmark.BenchmarkResult")
    check_range(confidence, "confidence", 0.0, 1.0, low_open=True, high_open=True)
    if len(result.records) == 0 or len(result.records[result.records["phase"] == "eval"]) == 0:
        raise ValueError(f"{NOTHING_FINISHED[:-1]}; nothing to plot. {result.failure_report()}".strip())
    ev = result.records[result.records["phase"] == "eval"]
    feds = list(dict.fromkeys(result.runs["federation"]))
    meths = [m for m in dict.fromkeys(result.runs["method"]) if methods is None or m in methods]
    fig, axes = plt.subplots(len(metrics), len(feds), figsize=(4.2 * len(feds), 3.2 * len(metrics)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for j, fed in enumerate(feds):
        for i, metric in enumerate(metrics):
            ax = axes[i][j]
            for c, meth in enumerate(meths):
                g = ev[(ev["federation"] == fed) & (ev["method"] == meth)]
                if len(g) == 0:
                    continue
                table = g.pivot(index="round", columns="seed", values=metric)
                n = table.shape[1]
                mu = table.mean(axis=1).to_numpy()
                half = (
                    stats.t.ppf(0.5 + confidence / 2, n - 1) * table.std(axis=1, ddof=1).to_numpy() / math.sqrt(n)
                    if n > 1
                    else np.zeros_like(mu)
                )
                x = table.index.to_numpy()
                ax.plot(x, mu, color=cmap(c % 20), lw=1.2, label=meth)
                ax.fill_between(x, mu - half, mu + half, color=cmap(c % 20), alpha=0.15, lw=0)
            ax.set_title(f"{fed}: {metric}", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    return fig


def plot_intervals(summary, metric: str = "lastk"):
    """Per federation: each method's paired difference to FedAvg with its 95 % t-interval.

    Green / red: better / worse than FedAvg after Holm's correction within the federation;
    blue: equivalent (TOST within the protocol's margin); grey: inconclusive. The bars are the
    uncorrected 95 % intervals, so a bar that misses 0 can still be grey. Methods keep the
    grid's order: the plot is not a ranking.

    Args:
        summary: a :func:`summarize` DataFrame.
        metric: one of ``"lastk"``, ``"final"``, ``"worst10"`` (those with paired differences).

    Returns:
        The matplotlib figure, one panel per federation.

    Raises:
        TypeError: ``summary`` is not a DataFrame, or ``metric`` not a string.
        ValueError: ``metric`` is not one of those, or the summary has no row (no evaluation
            run finished).
    """
    import matplotlib.pyplot as plt
    import pandas as pd

    check_instance(summary, "summary", pd.DataFrame, "a summarize() DataFrame")
    check_instance(metric, "metric", str, "a metric's name such as 'lastk'")
    _check_metrics(metric, ("lastk", "final", "worst10"), "metric")
    if len(summary) == 0:
        raise ValueError(f"{NOTHING_FINISHED[:-1]}; nothing to plot.")
    feds = list(dict.fromkeys(summary["federation"]))
    meths = list(dict.fromkeys(summary["method"]))
    fig, axes = plt.subplots(
        1, len(feds), figsize=(3.6 * len(feds), 0.28 * len(meths) + 1.2), squeeze=False, sharey=True
    )
    colour = {
        "better": "tab:green",
        "worse": "tab:red",
        "equivalent": "tab:blue",
        "inconclusive": "0.55",
        "baseline": "black",
        "untested": "white",
    }
    for j, fed in enumerate(feds):
        ax = axes[0][j]
        for y, meth in enumerate(meths):
            r = summary[(summary["federation"] == fed) & (summary["method"] == meth)]
            if len(r) == 0:
                continue
            r = r.iloc[0]
            d, h, verdict = 100 * r[f"d_{metric}"], 100 * r[f"d_{metric}_ci"], r[f"vs_{metric}"]
            if not math.isfinite(d):
                continue
            ax.errorbar(d, y, xerr=h if math.isfinite(h) else None, fmt="o", ms=3, capsize=2, color=colour[verdict])
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(fed, fontsize=9)
        ax.set_xlabel(f"{metric} minus FedAvg's (points)")
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].set_yticks(range(len(meths)), meths, fontsize=7)
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    return fig


def verdict_counts(summary, metrics=GUIDE_METRICS, alpha: float = 0.05) -> dict:
    """How many comparisons with the baseline say what, before and after the corrections.

    Args:
        summary: a :func:`summarize` DataFrame.
        metrics: the tested metrics to count over.
        alpha: the level.

    Returns:
        A dict of counts: ``tests`` (comparisons with a test), ``uncorrected`` (raw p below
        alpha), ``holm`` (Holm-adjusted p below alpha), ``bh`` (q below alpha), and one count
        per verdict: ``better``, ``worse``, ``equivalent``, ``inconclusive`` (the verdicts use
        Holm).

    Raises:
        TypeError: ``summary`` is not a DataFrame, ``metrics`` not names, ``alpha`` not a number.
        ValueError: a metric not in :data:`TESTED_METRICS`, ``alpha`` outside ``(0, 1)``.
    """
    import pandas as pd

    check_instance(summary, "summary", pd.DataFrame, "a summarize() DataFrame")
    metrics = _check_metrics(metrics, TESTED_METRICS)
    check_range(alpha, "alpha", 0.0, 1.0, low_open=True, high_open=True)
    counts = dict.fromkeys(("tests", "uncorrected", "holm", "bh", *VERDICTS), 0)
    for metric in metrics:
        p = summary[f"p_{metric}"].to_numpy(dtype=float)
        tested = np.isfinite(p)
        counts["tests"] += int(tested.sum())
        counts["uncorrected"] += int((p[tested] < alpha).sum())
        counts["holm"] += int((summary[f"p_holm_{metric}"].to_numpy(dtype=float)[tested] < alpha).sum())
        counts["bh"] += int((summary[f"q_{metric}"].to_numpy(dtype=float)[tested] < alpha).sum())
        for word in VERDICTS:
            counts[word] += int((summary[f"vs_{metric}"] == word).sum())
    return counts


def markdown_report(result: BenchmarkResult, command: str = "") -> str:
    """A Markdown report: the protocol, power, the table with corrected verdicts, picks, failures.

    Args:
        result: a :class:`BenchmarkResult`.
        command: the command that ran the sweep, quoted in the report (``""``: none).

    Returns:
        The report as Markdown text.

    Raises:
        TypeError: ``result`` is not a :class:`BenchmarkResult`, or ``command`` not a string.
    """
    from .. import stats

    check_instance(result, "result", BenchmarkResult, "a benchmark.BenchmarkResult")
    check_instance(command, "command", str, "the command as a string ('' for none)")

    p = result.protocol
    s = result.summary()
    failed = result._failed_cells(s)  # every run failed: a row and column of their own, marked so
    feds = list(dict.fromkeys([*s["federation"], *(f for f, _ in failed)]))
    meths = list(dict.fromkeys([*s["method"], *(m for _, m in failed)]))
    ran = set(zip(result.runs["federation"], result.runs["method"])) if len(result.runs) else set()
    commits = ", ".join(sorted({str(c)[:12] for c in result.runs.get("git_commit", []) if str(c)})) or "unknown"
    lines = ["# Benchmark report", ""]
    if len(s) == 0:
        lines += [
            f"**{NOTHING_FINISHED}** {len(result.failed)} of {len(result.runs)} runs failed; the failures are "
            "listed at the end.",
            "",
        ]
    if command:
        lines += ["Command:", "", f"    {command}", ""]
    lines += [
        f"Package {_version()}; the runs were computed at commit(s) {commits}. Tuning seeds "
        f"{list(p.tuning_seeds)}, evaluation seeds {list(p.eval_seeds)} (disjoint); {p.rounds} rounds, "
        f"{p.clients_per_round} clients per round, "
        f"{p.local_epochs} local epoch(s) of batch {p.batch_size} at lr {p.lr}. The pick maximises the mean over "
        f"the tuning seeds of the last-{p.last_k} mean client accuracy; a pick at an end of its grid extends the "
        f"grid there (at most {p.edge_cap} times per end). The intervals are conditional on the picks (the "
        "tuning's own variance is not in them).",
        "",
        f"Cells: mean over the {len(p.eval_seeds)} evaluation seeds of the last-{p.last_k} mean accuracy (%) +- "
        "the 95 % Student-t half-width; in brackets the paired difference to FedAvg on the same seeds, its verdict "
        f"and its Holm-adjusted p-value (within the federation). better / worse: adjusted p < {p.alpha:g}; "
        f"equivalent: a TOST within +-{100 * p.margin:g} points passes (Holm-adjusted); otherwise inconclusive. "
        "The table is not a ranking; - marks a method not run on that federation; a cell on fewer seeds than "
        "planned says how many (its failed runs are listed below, and the cell is over the runs that finished).",
        "",
        "| method | " + " | ".join(feds) + " |",
        "|---|" + "---|" * len(feds),
    ]
    for m in meths:
        cells = []
        for f in feds:
            r = s[(s["federation"] == f) & (s["method"] == m)]
            if len(r) == 0:
                cells.append("failed" if (f, m) in ran else "-")
                continue
            r = r.iloc[0]
            c = f"{100 * r['lastk']:.1f} +- {100 * r['lastk_ci']:.1f}"
            if int(r["n_seeds"]) < len(p.eval_seeds):
                c += f" [{int(r['n_seeds'])} of {len(p.eval_seeds)} seeds]"
            if r["vs_lastk"] not in ("baseline", "untested"):
                c += (
                    f" ({100 * r['d_lastk']:+.1f} +- {100 * r['d_lastk_ci']:.1f}, {r['vs_lastk']}, "
                    f"p={r['p_holm_lastk']:.2g})"
                )
            if r.get("edge"):
                c += f" [edge: {r['edge']}]"
            cells.append(c)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    sd = s["sd_lastk"].to_numpy(dtype=float)
    sd = sd[np.isfinite(sd) & (sd > 0)]
    if sd.size:
        family = max(1, int((s["vs_lastk"] != "baseline").groupby(s["federation"]).sum().max()))
        n = len(p.eval_seeds)
        med = float(np.median(sd))
        lines += [
            "",
            f"Power: the median standard deviation of a paired last-{p.last_k} difference is {100 * med:.2f} points; "
            f"with {n} seeds the smallest difference detected with 80 % power is "
            f"{100 * stats.min_detectable_difference(med, n, p.alpha):.1f} points uncorrected and "
            f"{100 * stats.min_detectable_difference(med, n, p.alpha, 0.8, family):.1f} points after the correction "
            f"for a family of {family} comparisons.",
        ]
    c = verdict_counts(s, alpha=p.alpha)
    lines += [
        "",
        f"Verdicts over the {c['tests']} comparisons of the guide's metrics ({', '.join(GUIDE_METRICS)}): "
        f"{c['uncorrected']} with p < {p.alpha:g} uncorrected, {c['holm']} after Holm within their families, "
        f"{c['bh']} with a Benjamini-Hochberg q < {p.alpha:g} across them; better {c['better']}, worse "
        f"{c['worse']}, equivalent {c['equivalent']}, inconclusive {c['inconclusive']}.",
        "",
        "Picked settings (tuning seeds), the grid each was picked from, and the picks still at an end of it:",
        "",
    ]
    for (f, m), settings in result.picks.items():
        text = json.dumps(settings, sort_keys=True) if settings is not None else "every candidate failed"
        grid = result.grids.get((f, m))
        if grid and any(len(v) > 1 for v in grid.values()):
            text += " from " + "; ".join(f"{k} {v}" for k, v in grid.items())
        edge = result.edges.get((f, m))
        if edge:
            text += " — at the edge: " + ", ".join(f"{k} {side}" for k, side in edge.items())
        lines.append(f"- {f}, {m}: {text}")
    report = result.failure_report()
    lines += ["", report if report else "No run failed.", ""]
    return "\n".join(lines)

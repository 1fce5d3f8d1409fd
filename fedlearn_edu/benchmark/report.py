"""Plots and the Markdown report of a :class:`~fedlearn_edu.benchmark.BenchmarkResult`."""

from __future__ import annotations

import json
import math
import numbers

import numpy as np

from ..checks import check_instance, check_range
from ..stats import VERDICTS, format_p
from .execution import VALUE_COLUMNS, _version
from .results import BenchmarkResult
from .summary import ACCURACY_METRICS, GUIDE_METRICS, NOTHING_FINISHED, TESTED_METRICS, _check_metrics


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


# The colours of the verdicts, in every plot of the benchmark.
VERDICT_COLOURS = {
    "better": "#1b7837",
    "worse": "#b2182b",
    "equivalent": "#2166ac",
    "inconclusive": "#999999",
    "baseline": "black",
    "untested": "white",
}
# The marks of a verdict's caveats, in the plots and tables (:func:`verdict_notes`).
MARKS = {
    "not_confirmed": "\u2020",  # dagger: the exact sign-flip test (Holm) does not confirm it
    "within_margin": "\u2248",  # almost equal: better/worse, but inside the equivalence margin
    "failures": "\u00d7",  # times: failed runs (their count follows)
    "failures_change": "\u2021",  # double dagger: counting failures as chance changes the verdict
    "edge": "E",  # the pick sits at an end of its tuning grid
}


_KEY = (
    f"{MARKS['not_confirmed']}: not confirmed by the exact test   {MARKS['edge']}: pick at a grid end   "
    f"{MARKS['failures']}k: k runs failed   {MARKS['within_margin']}: inside the margin   "
    f"{MARKS['failures_change']}: failures change it"
)


def verdict_notes(row, metric: str = "lastk") -> dict:
    """The caveats of one comparison's verdict: ``{mark name: phrase}`` (see :data:`MARKS`).

    Args:
        row: a row of :meth:`BenchmarkResult.summary` (a Series or a namedtuple).
        metric: a tested metric.

    Returns:
        An ordered dict: ``not_confirmed`` (the exact test does not confirm a better/worse),
        ``within_margin`` (better/worse by less than the margin), ``failures_change`` (the
        row's own runs failed, and scoring them as chance accuracy changes the exact verdict),
        ``failures`` (failed runs) and
        ``edge`` (a pick at the end of its grid), each present only where it applies.
    """
    get = row.get if hasattr(row, "get") else lambda k, default=None: getattr(row, k, default)
    v = get(f"vs_{metric}")
    notes = {}
    if metric in ACCURACY_METRICS and v in ("better", "worse"):
        if get(f"vs_exact_{metric}") != v:
            notes["not_confirmed"] = f"not confirmed by the exact test ({get(f'vs_exact_{metric}')} by it)"
        if bool(get(f"within_margin_{metric}")):
            notes["within_margin"] = "smaller than the equivalence margin"
    failed = get("n_failed", 0)
    failed = int(failed) if isinstance(failed, numbers.Real) and math.isfinite(failed) else 0
    if metric in ACCURACY_METRICS and v not in ("baseline", "untested") and failed > 0:
        chance, exact = get(f"vs_chance_{metric}"), get(f"vs_exact_{metric}")
        if isinstance(chance, str) and chance not in (exact, "untested"):
            notes["failures_change"] = f"{chance} with its failed runs scored as chance"
    if failed > 0:
        notes["failures"] = f"{failed} of {failed + int(get('n_seeds'))} runs failed"
    edge = get("edge", "")
    if isinstance(edge, str) and edge:
        notes["edge"] = f"pick at the end of its grid ({edge})"
    return notes


def _marks(notes: dict) -> str:
    return "".join(MARKS[k] + (notes[k].split()[0] if k == "failures" else "") for k in notes)


def _check_summary(summary, metric: str):
    import pandas as pd

    check_instance(summary, "summary", pd.DataFrame, "a summarize() DataFrame")
    check_instance(metric, "metric", str, "a metric's name such as 'lastk'")
    _check_metrics(metric, ("lastk", "final", "worst10"), "metric")
    if len(summary) == 0:
        raise ValueError(f"{NOTHING_FINISHED[:-1]}; nothing to plot.")


def plot_intervals(summary, metric: str = "lastk", margin: float | None = None, federations=None, labels=None):
    """A forest plot: per federation, each method's paired difference to FedAvg with its 95 % t-interval.

    Colours are the corrected verdicts (:data:`VERDICT_COLOURS`): better / worse than FedAvg after
    Holm's correction within the federation, equivalent (TOST within the margin), inconclusive.
    The bars are the uncorrected 95 % intervals, so a bar that misses 0 can still be grey. A
    hollow marker is a better/worse the exact sign-flip test does not confirm; the marks of
    :data:`MARKS` follow each point (edge pick, failed runs, a difference inside the margin, a
    verdict that counting failures changes). Methods keep the grid's order: not a ranking.

    Args:
        summary: a :meth:`BenchmarkResult.summary` (or :func:`summarize`) DataFrame.
        metric: one of ``"lastk"``, ``"final"``, ``"worst10"`` (those with paired differences).
        margin: the equivalence margin (a fraction, e.g. ``protocol.margin``): drawn as a band
            around 0 (``None``: no band).
        federations: the federations to draw, one panel each (``None``: all, in order).
        labels: ``{federation: panel title}`` (``None``: the federations' names).

    Returns:
        The matplotlib figure, one panel per federation.

    Raises:
        TypeError: ``summary`` is not a DataFrame, or ``metric`` not a string.
        ValueError: ``metric`` is not one of those, or the summary has no row (no evaluation
            run finished).
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    _check_summary(summary, metric)
    feds = list(dict.fromkeys(summary["federation"])) if federations is None else list(federations)
    meths = list(dict.fromkeys(summary[summary["federation"].isin(feds)]["method"]))
    fig, axes = plt.subplots(
        1, len(feds), figsize=(2.9 * len(feds) + 0.9, 0.24 * len(meths) + 1.9), squeeze=False, sharey=True
    )
    for j, fed in enumerate(feds):
        ax = axes[0][j]
        if margin is not None:
            ax.axvspan(-100 * margin, 100 * margin, color="#2166ac", alpha=0.08, lw=0)
        for y, meth in enumerate(meths):
            r = summary[(summary["federation"] == fed) & (summary["method"] == meth)]
            if len(r) == 0:
                continue
            r = r.iloc[0]
            d, h, verdict = 100 * r[f"d_{metric}"], 100 * r[f"d_{metric}_ci"], r[f"vs_{metric}"]
            notes = verdict_notes(r, metric)
            if not math.isfinite(d):
                continue
            colour = VERDICT_COLOURS[verdict]
            hollow = "not_confirmed" in notes
            ax.errorbar(
                d,
                y,
                xerr=h if math.isfinite(h) else None,
                fmt="o",
                ms=4,
                capsize=2,
                color=colour,
                mfc="white" if hollow else colour,
            )
            marks = _marks({k: v for k, v in notes.items() if k != "not_confirmed"})
            if marks:
                ax.annotate(
                    marks,
                    (d + (h if math.isfinite(h) else 0), y),
                    xytext=(3, -3),
                    textcoords="offset points",
                    fontsize=6.5,
                    color="0.2",
                )
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(fed if labels is None else labels.get(fed, fed), fontsize=9)
        ax.set_xlabel("points", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].set_yticks(range(len(meths)), meths, fontsize=7)
    axes[0][0].invert_yaxis()
    handles = [
        Line2D([], [], marker="o", ls="", color=VERDICT_COLOURS[v], label=v)
        for v in ("better", "worse", "equivalent", "inconclusive")
    ]
    handles.append(Line2D([], [], marker="o", ls="", color="0.3", mfc="white", label="not confirmed by the exact test"))
    key = _KEY

    if margin is not None:
        key += f"   band: \u00b1{100 * margin:g} points"
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.text(0.5, 0.055, key, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def plot_verdict_map(summary, metric: str = "lastk", labels=None):
    """A method x federation map of the verdicts against FedAvg, each cell its difference and marks.

    Args:
        summary: a :meth:`BenchmarkResult.summary` (or :func:`summarize`) DataFrame.
        metric: one of ``"lastk"``, ``"final"``, ``"worst10"``.
        labels: ``{federation: column label}`` (``None``: the federations' names).

    Returns:
        The matplotlib figure: rows the methods in the grid's order, columns the federations, a
        cell coloured by its verdict (:data:`VERDICT_COLOURS`; white: not run there) and labelled
        with the paired difference in points and the marks of :data:`MARKS` (a dagger for a
        verdict the exact test does not confirm).

    Raises:
        TypeError, ValueError: as :func:`plot_intervals`.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    _check_summary(summary, metric)
    feds = list(dict.fromkeys(summary["federation"]))
    meths = list(dict.fromkeys(summary["method"]))
    image = np.ones((len(meths), len(feds), 3))
    fig, ax = plt.subplots(figsize=(1.25 * len(feds) + 1.6, 0.26 * len(meths) + 1.5))
    for r in summary.itertuples():
        i, j = meths.index(r.method), feds.index(r.federation)
        verdict = getattr(r, f"vs_{metric}")
        image[i, j] = to_rgb(VERDICT_COLOURS[verdict]) if verdict != "baseline" else (0.85, 0.85, 0.85)
        d = 100 * getattr(r, f"d_{metric}")
        text = "FedAvg" if verdict == "baseline" else (f"{d:+.1f}" if math.isfinite(d) else "untested")
        text += _marks(verdict_notes(r, metric))
        dark = verdict in ("better", "worse", "equivalent")
        ax.text(j, i, text, ha="center", va="center", fontsize=6.5, color="white" if dark else "black")
    ax.imshow(image, aspect="auto")
    ax.set_xticks(range(len(feds)), [f if labels is None else labels.get(f, f) for f in feds], fontsize=7)
    ax.set_yticks(range(len(meths)), meths, fontsize=7)
    ax.xaxis.tick_top()
    handles = [Patch(color=VERDICT_COLOURS[v], label=v) for v in ("better", "worse", "equivalent", "inconclusive")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.text(0.5, 0.045, _KEY, ha="center", fontsize=6.5)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def verdict_table(summary, metric: str = "lastk", alpha: float = 0.05):
    """The full table of one metric: methods (rows) x federations (columns), every cell read in full.

    A cell gives the method's mean ``+-`` the 95 % t half-width; against the baseline the paired
    difference ``+-`` its half-width, the verdict, the Holm-adjusted p-value and the caveats of
    :func:`verdict_notes` (their :data:`MARKS`); its failed runs; and for ``rounds_to_target``
    the share of the seeds that reach the target. The table is not a ranking: methods keep the
    summary's order.

    Args:
        summary: a :meth:`BenchmarkResult.summary` (or :func:`summarize`) DataFrame.
        metric: a tested metric (:data:`TESTED_METRICS`).
        alpha: the level that :func:`~fedlearn_edu.stats.format_p` keeps from being rounded to.

    Returns:
        A DataFrame of strings, indexed by method, one column per federation (``-``: not run).

    Raises:
        TypeError: ``summary`` is not a DataFrame.
        ValueError: ``metric`` is not a tested metric, or the summary has no row.
    """
    import pandas as pd

    check_instance(summary, "summary", pd.DataFrame, "a summarize() DataFrame")
    _check_metrics(metric, TESTED_METRICS, "metric")
    if len(summary) == 0:
        raise ValueError(NOTHING_FINISHED)
    scale, unit = (1.0, " rounds") if metric == "rounds_to_target" else (100.0, "")
    feds = list(dict.fromkeys(summary["federation"]))
    meths = list(dict.fromkeys(summary["method"]))
    table = pd.DataFrame("-", index=pd.Index(meths, name="method"), columns=feds)
    for _, r in summary.iterrows():
        text = f"{scale * r[metric]:.1f} +- {scale * r[metric + '_ci']:.1f}{unit}"
        if metric == "rounds_to_target":
            text += f" ({100 * r['reached_share']:.0f} % of seeds reach it)"
        v = r[f"vs_{metric}"]
        if v not in ("baseline", "untested"):
            text += (
                f"; {scale * r['d_' + metric]:+.1f} +- {scale * r['d_' + metric + '_ci']:.1f}, {v}, "
                f"p={format_p(r['p_holm_' + metric], alpha)}"
            )
        elif v == "untested":
            text += "; untested"
        marks = _marks(verdict_notes(r, metric))
        table.loc[r["method"], r["federation"]] = text + (f" {marks}" if marks else "")
    return table


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
        "planned says how many (its failed runs are listed below, and the cell is over the runs that finished). "
        "In square brackets, the checks of a verdict: a better/worse that the exact sign-flip test (Holm, same "
        "family) does not confirm, one smaller than the margin (its TOST passes too), the verdict when failed runs "
        "score chance accuracy where that differs, the failed runs, and a pick at the end of its grid.",
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
                    f"p={format_p(r['p_holm_lastk'], p.alpha)})"
                )
            notes = verdict_notes(r, "lastk")
            if notes:
                c += " [" + "; ".join(notes.values()) + "]"
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

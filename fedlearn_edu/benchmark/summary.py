"""The evaluation runs' statistics: :func:`summarize` (intervals, paired tests, corrections) and its table."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from ..checks import check_bool, check_instance, check_name, check_range
from .protocol import BenchmarkProtocol

METRICS = ("final", "lastk", "worst10", "std", "rounds_to_target", "sec_per_round")
# The metrics compared with the baseline seed by seed (paired tests, corrections, verdicts); the
# decision guide reads the first three; fewer rounds to the target is better.
TESTED_METRICS = ("lastk", "worst10", "rounds_to_target", "final")
GUIDE_METRICS = ("lastk", "worst10", "rounds_to_target")
LOWER_IS_BETTER = ("rounds_to_target",)
# Per tested metric M, the summary's columns X_M besides d_M, d_M_ci and vs_M.
_TEST_COLUMNS = ("n", "sd", "p", "dz", "p_perm", "p_holm", "q", "tost", "tost_holm", "mdd")
# The accuracy metrics (higher is better, with an equivalence margin): each also gets the checks of
# the verdict (_CHECK_COLUMNS): the exact sign-flip test under the same Holm family, the TOST of a
# "better/worse" difference, and the failed runs counted as chance accuracy.
ACCURACY_METRICS = ("lastk", "worst10", "final")
_CHECK_COLUMNS = ("p_perm_holm", "vs_exact", "within_margin", "d_chance", "p_chance", "p_chance_holm", "vs_chance")


def _lastk(values: np.ndarray, k: int) -> float:
    return float(np.mean(values[-k:]))


def _per_seed(rows, protocol: BenchmarkProtocol) -> dict:
    rows = rows.sort_values("round")
    mean = rows["mean"].to_numpy()
    k = protocol.last_k
    reached = rows["round"].to_numpy()[mean >= protocol.target]
    return {
        "final": float(mean[-1]),
        "lastk": _lastk(mean, k),
        "worst10": _lastk(rows["worst10"].to_numpy(), k),
        "std": _lastk(rows["std"].to_numpy(), k),
        "rounds_to_target": float(reached[0]) if reached.size else math.nan,
        "sec_per_round": float(rows["sec_per_round"].iloc[0]),
    }


def _family_stats(out: list, baseline: str, protocol: BenchmarkProtocol) -> None:
    """Corrections, verdicts and detectable differences, once every row's raw test is known.

    Holm within each (federation, metric) family of comparisons with the baseline (p-values and
    TOST p-values alike); Benjamini-Hochberg across every comparison of the guide's metrics
    (:data:`GUIDE_METRICS`) and, separately, across those of ``final``.
    """
    from .. import stats

    tested = [r for r in out if r["method"] != baseline]
    for metric in TESTED_METRICS:
        for fed in dict.fromkeys(r["federation"] for r in tested):
            family = [r for r in tested if r["federation"] == fed and math.isfinite(r[f"p_{metric}"])]
            _holm_into(family, f"p_{metric}", f"p_holm_{metric}")
            _holm_into(family, f"tost_{metric}", f"tost_holm_{metric}")
            for r in family:
                sd, n = r[f"sd_{metric}"], r[f"n_{metric}"]
                r[f"mdd_{metric}"] = (
                    stats.min_detectable_difference(sd, n, protocol.alpha, 0.8, len(family)) if sd > 0 else 0.0
                )
    for scope in (GUIDE_METRICS, ("final",)):
        cells = [(r, m) for m in scope for r in tested if math.isfinite(r[f"p_{m}"])]
        for (r, m), q in zip(cells, stats.benjamini_hochberg([r[f"p_{m}"] for r, m in cells])):
            r[f"q_{m}"] = float(q)
    for r in tested:
        for metric in TESTED_METRICS:
            if not math.isfinite(r[f"p_{metric}"]):
                continue
            sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
            r[f"vs_{metric}"] = stats.verdict(
                sign * r[f"d_{metric}"], r[f"p_holm_{metric}"], r[f"tost_holm_{metric}"], protocol.alpha
            )
    _check_verdicts(tested, protocol)


def _holm_into(family: list, raw: str, key: str) -> None:
    """Holm-adjust the finite values of column ``raw`` over the rows of ``family`` into column ``key``."""
    from .. import stats

    finite = [r for r in family if math.isfinite(r[raw])]
    for r, q in zip(finite, stats.holm([r[raw] for r in finite])):
        r[key] = float(q)


def _check_verdicts(tested: list, protocol: BenchmarkProtocol) -> None:
    """The checks of each accuracy verdict, family by family (the same Holm families as the verdicts).

    ``vs_exact_M``: the verdict with the exact sign-flip p-values in place of the t-test's (Holm
    within the family; the TOST unchanged); ``within_margin_M``: a better/worse difference whose
    own TOST (Holm) also passes, so it is smaller than the margin; ``vs_chance_M``: the exact
    verdict again with every failed run of the pair scored as chance accuracy (the tuning's rule),
    so a method that fails loses those seeds instead of leaving them out.
    """
    from .. import stats

    for metric in ACCURACY_METRICS:
        for fed in dict.fromkeys(r["federation"] for r in tested):
            family = [r for r in tested if r["federation"] == fed]
            _holm_into(family, f"p_perm_{metric}", f"p_perm_holm_{metric}")
            _holm_into(family, f"p_chance_{metric}", f"p_chance_holm_{metric}")
            _holm_into(family, f"tost_chance_{metric}", f"tost_chance_holm_{metric}")
            for r in family:
                if math.isfinite(r[f"p_perm_holm_{metric}"]):
                    r[f"vs_exact_{metric}"] = stats.verdict(
                        r[f"d_{metric}"], r[f"p_perm_holm_{metric}"], r[f"tost_holm_{metric}"], protocol.alpha
                    )
                if math.isfinite(r[f"p_chance_holm_{metric}"]):
                    r[f"vs_chance_{metric}"] = stats.verdict(
                        r[f"d_chance_{metric}"],
                        r[f"p_chance_holm_{metric}"],
                        r[f"tost_chance_holm_{metric}"],
                        protocol.alpha,
                    )
                r[f"within_margin_{metric}"] = bool(
                    r[f"vs_{metric}"] in ("better", "worse") and r[f"tost_holm_{metric}"] < protocol.alpha
                )


# The record columns summarize() reads.
_SUMMARY_INPUTS = ("phase", "federation", "method", "settings", "seed", "round", "mean", "worst10", "std", "evaluated")


def _summary_columns() -> list:
    """The columns of a :func:`summarize` frame (those of a summary without rows)."""
    cols = ["federation", "method", "settings", "n_seeds", "seeds", "evaluated"]
    for metric in METRICS:
        cols += [metric, f"{metric}_ci"] + (["reached"] if metric == "rounds_to_target" else [])
    cols += ["n_failed", "fail_rate", "reached_share"]
    for metric in TESTED_METRICS:
        cols += [f"{c}_{metric}" for c in _TEST_COLUMNS] + [f"d_{metric}", f"d_{metric}_ci", f"vs_{metric}"]
        if metric in ACCURACY_METRICS:
            cols += [f"{c}_{metric}" for c in _CHECK_COLUMNS]
    return cols


def _check_metrics(metrics, allowed, what: str = "metrics") -> list:
    """``metrics`` (a name or a list of names) as a list, each one of ``allowed``."""
    names = [metrics] if isinstance(metrics, str) else metrics
    if not isinstance(names, Iterable) or isinstance(names, (bytes, Mapping)):
        raise TypeError(f"{what} must be a metric's name or a list of them, got {metrics!r}.")
    names = list(names)
    if not names:
        raise ValueError(f"{what} is empty; choose from {list(allowed)}.")
    for name in names:
        if name not in allowed:
            raise ValueError(f"{what}: unknown metric {name!r}; choose from {list(allowed)}.")
    return names


# What a table or report says when no evaluation run finished.
NOTHING_FINISHED = "No evaluation run finished: nothing to tabulate (every run failed or none ran)."


def summarize(
    records,
    protocol: BenchmarkProtocol | None = None,
    baseline: str = "fedavg",
    confidence: float = 0.95,
    failures=(),
    chance=None,
):
    """The evaluation runs' summary: one row per federation x method, with corrected verdicts.

    Columns: ``federation, method, settings, n_seeds, seeds, evaluated``; for every metric of
    :data:`METRICS` its mean and t-interval half-width over the seeds (``M``, ``M_ci``;
    ``rounds_to_target`` over the seeds that reached the target, ``reached`` of them); and for
    every metric of :data:`TESTED_METRICS` the paired comparison with the baseline on the
    seeds both have (``rounds_to_target``: only when both reached the target on every one):

    - ``d_M``, ``d_M_ci``: the mean difference and its t-interval half-width; ``n_M``, ``sd_M``;
    - ``p_M``: the two-sided paired t-test; ``dz_M``: the standardised effect mean/sd;
    - ``p_perm_M``: the exact sign-flip permutation p-value (a check; NaN below 6 seeds);
    - ``p_holm_M``: Holm-adjusted within the (federation, metric) family of comparisons;
    - ``q_M``: Benjamini-Hochberg across all comparisons of :data:`GUIDE_METRICS` (``final``:
      across its own);
    - ``tost_M``, ``tost_holm_M``: the equivalence test against ``+-protocol.margin`` (accuracy
      metrics only), raw and Holm-adjusted;
    - ``mdd_M``: the smallest difference the family's corrected test detects with 80 % power at
      this row's spread and seeds;
    - ``vs_M``: ``"better"``/``"worse"`` when ``p_holm_M < alpha`` (fewer rounds is better for
      ``rounds_to_target``), ``"equivalent"`` when ``tost_holm_M < alpha``, else
      ``"inconclusive"``; ``"baseline"`` on the baseline's row, ``"untested"`` without a test.

    Failed runs are outcomes too: ``n_failed`` counts a row's failed evaluation runs (from
    ``failures``) and ``fail_rate`` is their share of its runs; ``reached_share`` is the share of
    its finished seeds that reach the target. Every verdict of an accuracy metric M of
    :data:`ACCURACY_METRICS` is checked three ways, in the same Holm families:

    - ``p_perm_holm_M``, ``vs_exact_M``: the verdict with the exact sign-flip p-values in place of
      the t-test's (``vs_M`` better/worse and ``vs_exact_M`` different: the exact test does not
      confirm it);
    - ``within_margin_M``: ``vs_M`` is better/worse *and* the TOST passes: a difference that is
      real but smaller than the margin;
    - ``d_chance_M``, ``p_chance_M``, ``p_chance_holm_M``, ``vs_chance_M``: the exact verdict
      with every failed run of the pair scored as ``chance`` accuracy (the tuning's rule for a
      failed run), on the seeds where either ran; where nothing failed it is ``vs_exact_M``.

    Args:
        records: tidy records (DataFrame) with columns ``phase, federation, method, settings,
            seed, round, mean, worst10, std, sec_per_round, evaluated``; only
            ``phase == "eval"`` rows are used.
        protocol: gives ``last_k``, ``target``, ``alpha`` and ``margin`` (``None``: the default).
        baseline: the method the paired differences are taken to.
        confidence: the level of the t-intervals.
        failures: the evaluation runs that failed, as ``(federation, method, seed)`` triples
            (:meth:`BenchmarkResult.summary` passes its failed runs).
        chance: the accuracy a failed run scores: a number, or ``{federation: number}``
            (:meth:`BenchmarkResult.summary`: one over the dataset's number of classes);
            ``None``: unknown, so a comparison with a failed run gets no ``vs_chance_M``.

    Returns:
        A DataFrame, one row per federation x method present, in the records' order; without
        rows (but with every column) when no evaluation run finished.

    Raises:
        TypeError: ``records`` is not a DataFrame, ``protocol`` not a :class:`BenchmarkProtocol`,
            ``baseline`` not a string or ``confidence`` not a number.
        ValueError: ``records`` has rows but lacks a column the summary needs; ``confidence``
            outside ``(0, 1)``; a failure that is not a ``(federation, method, seed)`` triple; a
            ``chance`` outside ``[0, 1]``.
    """
    import pandas as pd

    from .. import stats

    check_instance(records, "records", pd.DataFrame, "a pandas DataFrame of tidy records")
    if protocol is not None:
        check_instance(protocol, "protocol", BenchmarkProtocol, "a benchmark.BenchmarkProtocol or None")
    check_name(baseline, "baseline", "fedavg")
    check_range(confidence, "confidence", 0.0, 1.0, low_open=True, high_open=True)
    protocol = protocol or BenchmarkProtocol()
    failed = _check_failures(failures)
    chance_of = _check_chance(chance)
    if len(records) == 0:
        return pd.DataFrame(columns=_summary_columns())
    missing = [c for c in _SUMMARY_INPUTS if c not in records.columns]
    if missing:
        raise ValueError(f"records lacks the columns {missing}; pass the tidy records of a sweep (result.records).")
    ev = records[records["phase"] == "eval"]
    if len(ev) == 0:
        return pd.DataFrame(columns=_summary_columns())
    per = {}
    for (fed, meth), g in ev.groupby(["federation", "method"], sort=False):
        per[(fed, meth)] = {int(seed): _per_seed(r, protocol) for seed, r in g.groupby("seed")}
    out = []
    for (fed, meth), seeds in per.items():
        g = ev[(ev["federation"] == fed) & (ev["method"] == meth)]
        row = {
            "federation": fed,
            "method": meth,
            "settings": g["settings"].iloc[0],
            "n_seeds": len(seeds),
            "seeds": ",".join(str(s) for s in sorted(seeds)),
            "evaluated": g["evaluated"].iloc[0],
        }
        own_failed = failed.get((fed, meth), set())
        row["n_failed"] = len(own_failed)
        row["fail_rate"] = len(own_failed) / (len(seeds) + len(own_failed))
        for metric in METRICS:
            vals = np.array([seeds[s][metric] for s in sorted(seeds)])
            if metric == "rounds_to_target":
                row["reached"] = int(np.isfinite(vals).sum())
                row["reached_share"] = row["reached"] / len(seeds)
                vals = vals[np.isfinite(vals)]
            if vals.size >= 2:
                row[metric], row[f"{metric}_ci"] = stats.t_interval(vals, confidence)
            else:
                row[metric], row[f"{metric}_ci"] = (float(vals[0]) if vals.size else math.nan), math.nan
        base = per.get((fed, baseline))
        for metric in TESTED_METRICS:
            nan = dict.fromkeys(_TEST_COLUMNS, math.nan)
            row.update({f"{c}_{metric}": v for c, v in nan.items()})
            common = sorted(set(seeds) & set(base)) if base else []
            d = np.array([seeds[s][metric] - base[s][metric] for s in common])
            word = "baseline" if meth == baseline else "untested"
            if metric in ACCURACY_METRICS:
                row.update({f"{c}_{metric}": math.nan for c in _CHECK_COLUMNS})
                row.update({f"vs_exact_{metric}": word, f"within_margin_{metric}": False, f"vs_chance_{metric}": word})
                # the TOST of the chance-scored differences, raw and Holm-adjusted: for vs_chance_M only
                row[f"tost_chance_{metric}"] = row[f"tost_chance_holm_{metric}"] = math.nan
                if meth != baseline and base:
                    chance_d = _scored_as_chance(
                        seeds, base, metric, own_failed, failed.get((fed, baseline), set()), chance_of(fed)
                    )
                    if chance_d is not None and chance_d.size >= 2:
                        row[f"d_chance_{metric}"] = float(chance_d.mean())
                        if chance_d.size >= 6:
                            row[f"p_chance_{metric}"] = stats.sign_flip_p(chance_d)
                        row[f"tost_chance_{metric}"] = stats.tost(chance_d, protocol.margin)
            if meth == baseline:
                row.update({f"d_{metric}": 0.0, f"d_{metric}_ci": 0.0, f"vs_{metric}": "baseline"})
                continue
            row[f"vs_{metric}"] = "untested"
            if d.size < 2 or not np.isfinite(d).all():
                continue
            t = stats.paired_test(d, confidence)
            row.update(
                {
                    f"n_{metric}": t.n,
                    f"d_{metric}": t.mean,
                    f"d_{metric}_ci": t.half_width,
                    f"sd_{metric}": t.sd,
                    f"p_{metric}": t.p,
                    f"dz_{metric}": t.d_z,
                    f"p_perm_{metric}": stats.sign_flip_p(d) if t.n >= 6 else math.nan,
                }
            )
            if metric not in LOWER_IS_BETTER:
                row[f"tost_{metric}"] = stats.tost(d, protocol.margin)
        out.append(row)
    _family_stats(out, baseline, protocol)
    for row in out:
        for metric in ACCURACY_METRICS:
            row.pop(f"tost_chance_{metric}")
            row.pop(f"tost_chance_holm_{metric}")
    return pd.DataFrame(out)


def _check_failures(failures) -> dict:
    """``failures`` (``(federation, method, seed)`` triples) as ``{(federation, method): {seed, ...}}``."""
    if isinstance(failures, (str, bytes, Mapping)) or not isinstance(failures, Iterable):
        raise TypeError(f"failures must be a list of (federation, method, seed) triples, got {failures!r}.")
    out: dict = {}
    for item in failures:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"failures: each failed run is a (federation, method, seed) triple, got {item!r}.")
        fed, meth, seed = item
        out.setdefault((fed, meth), set()).add(int(seed))
    return out


def _check_chance(chance):
    """``chance`` (None, a number or ``{federation: number}``) as a function of the federation's name."""
    if chance is None:
        return lambda fed: None
    values = chance if isinstance(chance, Mapping) else None
    for v in values.values() if values is not None else (chance,):
        check_range(v, "chance", 0.0, 1.0)
    if values is None:
        return lambda fed: float(chance)
    return lambda fed: float(values[fed]) if fed in values else None


def _scored_as_chance(seeds: dict, base: dict, metric: str, own_failed: set, base_failed: set, chance):
    """The paired differences where a failed run scores ``chance``.

    On every seed where both methods ran (finished or failed); ``None`` where a run failed and
    ``chance`` is unknown.
    """
    if (own_failed or base_failed) and chance is None:
        return None
    mine = {s: v[metric] for s, v in seeds.items()} | dict.fromkeys(own_failed, chance)
    theirs = {s: v[metric] for s, v in base.items()} | dict.fromkeys(base_failed, chance)
    d = np.array([mine[s] - theirs[s] for s in sorted(set(mine) & set(theirs))], dtype=float)
    return d if np.isfinite(d).all() else None


def format_results_table(summary, metrics=("lastk", "worst10"), percent: bool = True, failed=()) -> str:
    """The summary as text: ``mean +- half-width`` per method (rows) x federation (columns).

    The paired difference to FedAvg follows each cell with its verdict and Holm-adjusted
    p-value: ``(+d +- h, better p=0.003)``. Rows keep the grid's order: the table is not a
    ranking. ``failed`` marks a method every run of which failed on a federation (the failure
    report names those); ``-`` one not in the grid there (``methods_for``).

    Args:
        summary: a :func:`summarize` DataFrame.
        metrics: the metrics to show, one block each (names of :data:`METRICS`).
        percent: show fractions as percentages.
        failed: the ``(federation, method)`` pairs every run of which failed (shown as
            ``failed``, with their row and column even when nothing else is in them).

    Returns:
        The table as lines of text, one block per metric; :data:`NOTHING_FINISHED` when the
        summary has no row.

    Raises:
        TypeError: ``summary`` is not a DataFrame, ``metrics`` not names, ``percent`` not a bool.
        ValueError: a metric not in :data:`METRICS`, or a summary without its columns.
    """
    import pandas as pd

    from .. import stats

    metrics = _check_metrics(metrics, METRICS)
    check_instance(summary, "summary", pd.DataFrame, "a summarize() DataFrame")
    check_bool(percent, "percent")
    if len(summary) == 0:
        return NOTHING_FINISHED + "\n"
    missing = [c for c in ("federation", "method", *metrics, *(f"{m}_ci" for m in metrics)) if c not in summary.columns]
    if missing:
        raise ValueError(f"summary lacks the columns {missing}; pass a summarize() DataFrame.")
    scale = 100.0 if percent else 1.0
    failed = {tuple(c) for c in failed}
    feds = list(dict.fromkeys([*summary["federation"], *(f for f, _ in failed)]))
    meths = list(dict.fromkeys([*summary["method"], *(m for _, m in failed)]))
    lines = []
    for metric in metrics:
        lines.append(
            f"{metric} ({'%' if percent else 'fraction'}; mean +- 95% t-interval over seeds; "
            "vs FedAvg: paired difference, verdict, Holm-adjusted p)"
        )
        width = max(len(m) for m in meths) + 2
        cells = {}
        for _, r in summary.iterrows():
            text = f"{scale * r[metric]:.1f}+-{scale * r[metric + '_ci']:.1f}"
            if f"vs_{metric}" in r and r[f"vs_{metric}"] not in ("baseline", "untested"):
                text += (
                    f" ({scale * r['d_' + metric]:+.1f}+-{scale * r['d_' + metric + '_ci']:.1f} "
                    f"{r['vs_' + metric]} p={stats.format_p(r['p_holm_' + metric])})"
                )
            cells[(r["federation"], r["method"])] = text
        cells.update({c: "failed" for c in failed if c not in cells})
        colw = max([len(c) for c in cells.values()] + [len(f) for f in feds]) + 2
        lines.append("".ljust(width) + "".join(f.ljust(colw) for f in feds))
        for m in meths:
            lines.append(m.ljust(width) + "".join(cells.get((f, m), "-").ljust(colw) for f in feds))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"

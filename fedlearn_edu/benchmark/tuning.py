"""Tuning: every candidate on the tuning seeds, :func:`select`'s pick, and the edge rule."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np

from ..checks import check_instance
from ..data.datasets import dataset_info
from .backends import run_configs
from .execution import _config, _plain_record, run_key
from .protocol import BenchmarkProtocol
from .store import _Store
from .summary import _lastk


def _beyond(values: list, end: int) -> float:
    """The next value past one end of a geometric grid (its ratio at that end)."""
    a, b = (values[-1], values[-2]) if end == 1 else (values[0], values[1])
    return float(f"{a * a / b:.12g}")


def _tune(ms, feds, protocol: BenchmarkProtocol, out, opts, cells=None) -> tuple:
    """Tuning with the edge rule -> ``(picks, grids, edges, configs, statuses)``.

    Runs every candidate of every method's grid on the tuning seeds, picks (:func:`select`),
    and while a pick sits at an end of its grid in a setting of :attr:`Method.extend`, adds the
    next geometric value past that end (at most ``protocol.edge_cap`` per end) and runs again.
    ``grids[(federation, method)]`` is the final grid, ``edges[(federation, method)]`` maps each
    tuned setting whose pick is still at an end to ``"low"`` or ``"high"`` (for an extended
    setting: the cap was reached). ``cells``: the ``(federation, method)`` pairs to tune
    (``None``: every method on every federation).
    """
    cells = _cells(ms, feds) if cells is None else cells
    tunable = [(f, m) for f, m in cells if len(m.candidates()) > 1]
    grids = {(f.name, m.name): {k: list(v) for k, v in m.tune.items()} for f, m in cells}
    used = {(f.name, m.name): {k: [0, 0] for k in m.extend} for f, m in tunable}
    store, configs, statuses, wave = _Store(out), [], {}, 0
    while True:
        wave += 1
        new = []
        for f, m in tunable:
            for settings in m.candidates(grids[(f.name, m.name)]):
                for seed in protocol.tuning_seeds:
                    cfg = _config(m, f, protocol, settings, seed, "tune")
                    if run_key(cfg) not in statuses:
                        new.append(cfg)
        if not new:
            break
        desc = "tuning" if wave == 1 else f"tuning, edge rule {wave - 1}"
        statuses.update(run_configs(new, out, desc=desc, **opts))
        configs += new
        picks = select(_frame(store, configs, statuses), ms, feds, protocol, grids, cells)
        for f, m in tunable:
            pair, pick = (f.name, m.name), picks[(f.name, m.name)]
            for k in m.extend if pick is not None else ():
                values = grids[pair][k]
                for end, at in ((1, values[-1]), (0, values[0])):
                    if len(values) > 1 and pick[k] == at and used[pair][k][end] < protocol.edge_cap:
                        used[pair][k][end] += 1
                        values.insert(len(values) if end else 0, _beyond(values, end))
                        break
    picks = select(_frame(store, configs, statuses), ms, feds, protocol, grids, cells)
    edges = {}
    for f, m in tunable:
        pair, pick = (f.name, m.name), picks[(f.name, m.name)]
        if pick is None:
            continue
        at = {}
        for k, v in grids[pair].items():
            if len(set(v)) > 1 and pick[k] in (min(v), max(v)):
                at[k] = "high" if pick[k] == max(v) else "low"
        if at:
            edges[pair] = at
    return picks, grids, edges, configs, statuses


def _frame(store: _Store, configs, statuses):
    keys = [k for k in dict.fromkeys(run_key(c) for c in configs) if statuses.get(k) in ("done", "cached")]
    return store.frame(keys)


def _cells(methods, federations) -> list:
    return [(f, m) for f in federations for m in methods]


def select(
    tune_records, methods, federations, protocol: BenchmarkProtocol, grids: Mapping | None = None, cells=None
) -> dict:
    """``{(federation, method): settings}``: the tuning pick (``None`` when every candidate failed).

    The criterion: the mean over the tuning seeds of the mean client accuracy averaged over the
    last ``protocol.last_k`` evaluations; a failed or missing run (or one whose accuracy is not
    finite) scores chance accuracy, one over the dataset's number of classes, the score
    :func:`summarize` gives a failed evaluation run in its ``vs_chance_M`` check; ties go to the
    first candidate in the grid's order. A method with a single candidate picks it (it has
    no tuning runs).

    Args:
        tune_records: the tuning runs' tidy records (a DataFrame with columns ``federation,
            method, settings`` (sorted JSON), ``seed, round, mean``; may be empty).
        methods: the :class:`Method` s of the grid.
        federations: the :class:`FederationSpec` s of the grid.
        protocol: gives ``tuning_seeds`` and ``last_k``.
        grids: ``{(federation, method): {setting: candidates}}``, the grids as the edge rule
            extended them (``None``: every method's own ``tune``).
        cells: the ``(FederationSpec, Method)`` pairs to pick for (``None``: every method on
            every federation).

    Returns:
        ``{(federation name, method name): settings dict or None}``.

    Raises:
        TypeError: ``tune_records`` is not a DataFrame, ``protocol`` not a
            :class:`BenchmarkProtocol`, ``grids`` not a mapping.
    """
    import pandas as pd

    check_instance(tune_records, "tune_records", pd.DataFrame, "a DataFrame of the tuning runs' records")
    check_instance(protocol, "protocol", BenchmarkProtocol, "a benchmark.BenchmarkProtocol")
    if grids is not None:
        check_instance(grids, "grids", Mapping, "a mapping {(federation, method): {setting: candidates}}")
    picks = {}
    for f, m in _cells(methods, federations) if cells is None else cells:
        if len(m.candidates()) == 1:  # nothing to tune (no tuning run)
            picks[(f.name, m.name)] = _plain_record(m.candidates()[0])
            continue
        grid = (grids or {}).get((f.name, m.name), m.tune)
        chance = 1.0 / dataset_info(f.dataset).num_classes
        best, best_score, finished = None, -math.inf, False  # finished: some run of some candidate finished
        for settings in m.candidates(grid):
            text = json.dumps(_plain_record(settings), sort_keys=True)
            scores = []
            for seed in protocol.tuning_seeds:
                rows = (
                    tune_records[
                        (tune_records["federation"] == f.name)
                        & (tune_records["method"] == m.name)
                        & (tune_records["settings"] == text)
                        & (tune_records["seed"] == seed)
                    ]
                    if len(tune_records)
                    else []
                )
                if len(rows) == 0:
                    scores.append(chance)
                    continue
                s = _lastk(rows.sort_values("round")["mean"].to_numpy(), protocol.last_k)
                scores.append(s if math.isfinite(s) else chance)
                finished = True
            score = float(np.mean(scores))
            if score > best_score:
                best, best_score = settings, score
        picks[(f.name, m.name)] = _plain_record(best) if finished else None
    return picks

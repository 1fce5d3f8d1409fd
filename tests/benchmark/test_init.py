"""fedlearn_edu.benchmark's public entry points: an argument of the wrong type is a TypeError naming it.

Issue 33: every check goes through :mod:`fedlearn_edu.checks`; a wrong type was a ValueError in
places (the protocol's counts and rates, a name that is not a string), an AttributeError or a
KeyError deep inside in others (``execute``, ``rerun``, the plots and counts of a summary), or
went through unnoticed (a tensor as a share of noisy clients broke the run key's JSON later).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import backends

FRAME = pd.DataFrame({"run_key": ["k"], "config": ["{}"]})


def _no_run(config, factory=None, root=None):
    raise AssertionError("a run started although an argument has the wrong type")


def _cases(tmp_path):
    b = benchmark
    run = dict(methods=["fedavg"], federations=["iid"], out=tmp_path / "out", backend="sequential", progress=False)
    return [
        # the sweep
        ("out", lambda: b.run(**{**run, "out": 5})),
        ("root", lambda: b.run(**run, root=5)),
        ("methods_for", lambda: b.run(**run, methods_for=["fedavg"])),
        ("progress", lambda: b.run(**{**run, "progress": "no"})),
        ("protocol", lambda: b.run(**run, protocol="default")),
        ("backend", lambda: b.run(**{**run, "backend": 1})),
        ("dask_client", lambda: b.run(**{**run, "backend": "dask"}, dask_client=123)),
        ("scheduler", lambda: b.run(**{**run, "backend": "dask"}, scheduler=5)),
        ("n_jobs", lambda: b.run(**{**run, "backend": "joblib"}, n_jobs=1.5)),
        ("rounds", lambda: b.run(**run, rounds=2.0)),
        ("configs", lambda: b.run_configs("runs", tmp_path, backend="sequential")),
        ("configs[0]", lambda: b.run_configs([5], tmp_path, backend="sequential")),
        ("out", lambda: b.run_configs([], None, backend="sequential")),
        ("n_jobs", lambda: b.run_configs([], tmp_path, n_jobs="2")),
        ("progress", lambda: b.run_configs([], tmp_path, backend="sequential", progress=1)),
        # one run
        ("config", lambda: b.execute("fedavg")),
        ("factory", lambda: b.execute({}, factory="fedavg")),
        ("root", lambda: b.execute({}, root=5)),
        # results and records
        ("out", lambda: b.load(5)),
        ("records", lambda: b.rerun(5, "k")),
        ("key", lambda: b.rerun(FRAME, 5)),
        ("grid", lambda: b.records_folder(5)),
        ("root", lambda: b.records_folder("classroom", root=5)),
        ("download", lambda: b.classroom_records(download="no")),
        # statistics, tables, plots, report
        ("records", lambda: b.summarize([1, 2])),
        ("protocol", lambda: b.summarize(pd.DataFrame(), protocol="default")),
        ("baseline", lambda: b.summarize(pd.DataFrame(), baseline=5)),
        ("confidence", lambda: b.summarize(pd.DataFrame(), confidence="95%")),
        ("summary", lambda: b.format_results_table([1])),
        ("metrics", lambda: b.format_results_table(pd.DataFrame(), metrics=5)),
        ("percent", lambda: b.format_results_table(pd.DataFrame(), percent="yes")),
        ("tune_records", lambda: b.select([], [], [], b.BenchmarkProtocol())),
        ("protocol", lambda: b.select(pd.DataFrame(), [], [], "default")),
        ("result", lambda: b.plot_curves("result")),
        ("summary", lambda: b.plot_intervals([1])),
        ("metric", lambda: b.plot_intervals(pd.DataFrame(), metric=5)),
        ("summary", lambda: b.verdict_counts({})),
        ("alpha", lambda: b.verdict_counts(pd.DataFrame(), metrics=["lastk"], alpha="0.05")),
        ("result", lambda: b.markdown_report("result")),
        # the grid
        ("server_lr", lambda: b.fixed_step("fedavg", "1")),
        ("method", lambda: b.method(5)),
        ("federation", lambda: b.parse_federation(5)),
        ("rounds", lambda: b.BenchmarkProtocol(rounds=2.0)),
        ("lr", lambda: b.BenchmarkProtocol(lr="0.1")),
        ("engine", lambda: b.BenchmarkProtocol(engine=5)),
        ("tuning_seeds", lambda: b.BenchmarkProtocol(tuning_seeds=("a",))),
        ("edge_cap", lambda: b.BenchmarkProtocol(edge_cap=1.0)),
        ("name", lambda: b.Method(5)),
        ("fixed", lambda: b.Method("x", fixed=[("mu", 1)])),
        ("tune", lambda: b.Method("x", tune={"server_lr": 1.0})),
        ("note", lambda: b.Method("x", note=5)),
        ("name", lambda: b.FederationSpec(5)),
        ("partition", lambda: b.FederationSpec("d", partition=5)),
        ("num_clients", lambda: b.FederationSpec("d", num_clients=torch.tensor(4))),
        ("noise_fraction", lambda: b.FederationSpec("d", noise_fraction=torch.tensor(0.5))),
        ("attack", lambda: b.FederationSpec("d", attack=5)),
        ("root", lambda: b.FederationSpec("d", root=5)),
        (
            "num_clusters",
            lambda: b.FederationSpec(
                "c", partition="clusters", num_clients=4, partition_params={"num_clusters": 2.0, "shift": "label"}
            ),
        ),
    ]


def test_a_wrong_type_to_each_public_entry_point_is_a_type_error_naming_the_argument(monkeypatch, tmp_path):
    monkeypatch.setattr(backends, "execute", _no_run)
    for name, call in _cases(tmp_path):
        with pytest.raises(TypeError) as err:
            call()
        assert name in str(err.value), f"{name}: {err.value}"
        assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before any run or file

"""The benchmark's personalised, decentralised and client-conditional methods and its clustered federation.

Local-only training, Gossip, DAC and client-conditional FL run through :func:`benchmark.execute`
on every classroom federation and on ``"clusters:K"`` (K label-shift clusters); the keys of the
runs the committed grids hold are unchanged by their arrival.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import execution
from fedlearn_edu.data import cluster_ids

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
NEW = {"local": "personal", "gossip": "personal", "dac": "personal", "conditional": "conditional"}
TINY = benchmark.BenchmarkProtocol(rounds=2, clients_per_round=4, last_k=1)
COMMON = {"num_clients": 8, "num_samples": 400}
FEDERATIONS = (*benchmark.CLASSROOM_FEDERATIONS, "clusters:4")


def _tiny(name: str, federation: str, seed: int = 0) -> dict:
    m = benchmark.METHODS[name]
    return execution._config(m, benchmark.parse_federation(federation, **COMMON), TINY, m.candidates()[0], seed, "eval")


@pytest.mark.parametrize("federation", FEDERATIONS)
@pytest.mark.parametrize("name", sorted(NEW))
def test_a_new_method_runs_on_every_federation(name, federation):
    result = benchmark.execute(_tiny(name, federation))
    assert result["status"] == "ok", result.get("traceback")
    assert result["evaluated"] == NEW[name]
    assert [row["round"] for row in result["rows"]] == [0, 1, 2]
    for row in result["rows"]:
        assert all(math.isfinite(row[k]) and 0 <= row[k] <= 1 for k in ("mean", "worst10", "best10")), row


def test_the_new_methods_tune_what_they_have():
    for name in ("local", "gossip", "dac"):  # no server step: one candidate, nothing tuned
        assert len(benchmark.METHODS[name].candidates()) == 1 and not benchmark.METHODS[name].tune
    assert benchmark.METHODS["local"].candidates() == [{}]
    assert benchmark.METHODS["dac"].candidates() == [{"num_neighbours": 3, "tau": 30.0}]
    conditional = benchmark.METHODS["conditional"]
    assert conditional.tune == {"server_lr": [1.0, 2.0, 4.0]} and len(conditional.candidates()) == 3
    for name, evaluated in NEW.items():
        assert benchmark.METHODS[name].note.startswith(f"{evaluated}:"), name
    assert benchmark.method("DAC") is benchmark.METHODS["dac"]


def test_a_federation_too_small_for_the_neighbours_is_refused_by_name():
    m = benchmark.METHODS["gossip"]
    fed = benchmark.parse_federation("dirichlet:0.5", num_clients=3, num_samples=200)
    result = benchmark.execute(execution._config(m, fed, TINY, m.candidates()[0], 0, "eval"))
    assert result["status"] == "failed" and "num_neighbours must be below the number of clients" in result["error"]


def test_conditional_fl_packs_each_clients_fingerprint():
    """The conditional run equals FedAvg on fingerprint_federation with the conditional model, by hand."""
    from fedlearn_edu import FedAvg, simulate
    from fedlearn_edu.conditional import fingerprint_federation, make_conditional_model

    cfg = _tiny("conditional", "clusters:4")
    result = benchmark.execute(cfg)
    fed = execution._clustered_federation(cfg["federation"], 0, None)
    settings = cfg["settings"]
    net = make_conditional_model("mlp", fed.input_shape, 10, 32, seed=0, cond_scale=settings["cond_scale"])
    history = simulate(
        fingerprint_federation(fed, 32),
        net,
        FedAvg(server_lr=settings["server_lr"]),
        rounds=2,
        clients_per_round=4,
        local_epochs=1,
        batch_size=10,
        lr=0.1,
        seed=0,
        device="cpu",
        progress=False,
    )
    np.testing.assert_array_equal([r["mean"] for r in result["rows"]], history.client_accuracy.mean(axis=1))


def test_the_clustered_federation_parses_and_is_seeded():
    spec = benchmark.parse_federation("clusters:4", **COMMON)
    assert (spec.partition, spec.partition_params) == ("clusters", {"num_clusters": 4, "shift": "label"})
    execution._FED_CACHE.clear()
    first = execution._clustered_federation(spec.config(), 3, None)
    execution._FED_CACHE.clear()
    again = execution._clustered_federation(spec.config(), 3, None)
    other = execution._clustered_federation(spec.config(), 4, None)
    assert first is not again and first.num_clients == 8
    ids = cluster_ids(first)
    assert sorted(np.bincount(ids)) == [2, 2, 2, 2]  # K = 4 clusters of 8 / 4 clients
    assert all(c.num_train + c.num_test == 400 // 8 for c in first)
    classes = [set(c.train_y.tolist()) for c in first]
    assert all(classes[i] <= set(first[i].info["classes"]) for i in range(8))  # a label shift
    assert len({frozenset(first[i].info["classes"]) for i in range(8)}) == 4
    for a, b in zip(first, again):
        assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y) and a.info == b.info
    assert any(not torch.equal(a.train_x, b.train_x) for a, b in zip(first, other))


@pytest.mark.parametrize(
    "text, common, match",
    [
        ("clusters", {}, "number of clusters"),
        ("clusters:1", {}, "number of clusters"),
        ("clusters:2.5", {}, "number of clusters"),
        ("clusters:3", {"num_clients": 8}, "8 clients cannot form 3 clusters"),
    ],
)
def test_bad_clusters_are_refused_by_name(text, common, match):
    with pytest.raises(ValueError, match=match):
        benchmark.parse_federation(text, **common)
    with pytest.raises(ValueError, match="num_clusters and shift"):
        benchmark.FederationSpec("x", partition="clusters", partition_params={"num_clusters": 2})


def test_keys_are_stable(monkeypatch):
    """Hard-coded keys (under a fixed version): a change to the configuration's format is noticed."""
    monkeypatch.setattr(execution, "_version", lambda: "0.0.0-test")
    cfg = _tiny("conditional", "clusters:4")
    assert benchmark.run_key(cfg) == benchmark.run_key(_tiny("conditional", "clusters:4"))
    assert benchmark.run_key(cfg) != benchmark.run_key(_tiny("conditional", "clusters:2"))
    assert benchmark.run_key(cfg) == "99a5e293ea78b15f"
    assert cfg["federation"]["partition_params"] == {"num_clusters": 4, "shift": "label"}
    assert cfg["settings"] == {"num_eigenvalues": 32, "cond_scale": 2.5, "server_lr": 1.0}
    full = benchmark.BenchmarkProtocol()
    fedavg = benchmark.METHODS["fedavg"]
    for text, key in (("dirichlet:0.1", "7f31e21c923b7df2"), ("noisy:0.8", "ae60306b327b2e14")):
        old = execution._config(fedavg, benchmark.parse_federation(text), full, {"server_lr": 1.0}, 1, "eval")
        assert benchmark.run_key(old) == key, text


@pytest.mark.parametrize("grid", ["classroom", "robust"])
def test_the_committed_runs_configurations_are_rebuilt_unchanged(grid):
    """Every committed run's configuration, rebuilt from METHODS and its federation string, is the recorded one."""
    import pandas as pd

    runs = pd.read_csv(RESULTS / grid / "runs.csv", keep_default_na=False)
    proto = json.loads((RESULTS / grid / "protocol.json").read_text())
    fields = {f.name for f in dataclasses.fields(benchmark.BenchmarkProtocol)}
    protocol = benchmark.BenchmarkProtocol(
        **{k: (tuple(v) if isinstance(v, list) else v) for k, v in proto.items() if k in fields}
    )
    for row in runs.itertuples():
        cfg = json.loads(row.config)
        fed = cfg["federation"]
        spec = benchmark.parse_federation(
            row.federation, dataset=fed["dataset"], num_clients=fed["num_clients"], model=fed["model"]
        )
        again = execution._config(benchmark.METHODS[row.method], spec, protocol, cfg["settings"], row.seed, row.phase)
        assert again == cfg, (row.method, row.federation)
        assert benchmark.run_key(again) == row.run_key

"""fedlearn_edu.benchmark's record store: what resuming redoes, sweeps sharing a folder, killed sweeps.

A stored run is reused only when its files are whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlearn_edu import benchmark

PROTOCOL = benchmark.Protocol(rounds=2, last_k=1, clients_per_round=2, tuning_seeds=(0,), eval_seeds=(1, 2))
FED = benchmark.parse_federation("dirichlet:0.5", num_clients=4, num_samples=200)


def _configs(seeds=(1, 2)) -> list[dict]:
    fedavg = benchmark.METHODS["fedavg"]
    return [benchmark._config(fedavg, FED, PROTOCOL, {"server_lr": 1.0}, seed, "eval") for seed in seeds]


def _sweep(out, configs, redone=None) -> dict:
    return benchmark.run_configs(configs, out, engine="sequential", progress=False, redone=redone)


def _consistent(out) -> None:
    """Every stored run is whole: its manifest holds its csv's checksum."""
    runs = Path(out) / "runs"
    for path in runs.glob("*.json"):
        meta = json.loads(path.read_text())
        assert meta["key"] == path.stem and meta["status"] == "ok"
        assert meta["csv_sha256"] == benchmark._sha((runs / f"{path.stem}.csv").read_bytes()), path.stem
    assert sorted(p.stem for p in runs.glob("*.csv")) == sorted(p.stem for p in runs.glob("*.json"))


# --------------------------------------------------------------------------- damaged manifests


@pytest.mark.parametrize("manifest", ["[]", '"ok"', "3", "null", "flip"])
def test_a_manifest_that_is_not_a_record_is_redone(tmp_path, manifest):
    out, configs = tmp_path / "out", _configs()
    _sweep(out, configs)
    path = out / "runs" / f"{benchmark.run_key(configs[0])}.json"
    if manifest == "flip":  # one flipped bit in the status: "ok" -> "oj"
        path.write_text(path.read_text().replace('"status": "ok"', '"status": "oj"'))
        assert '"oj"' in path.read_text()
    else:  # valid JSON, not an object
        path.write_text(manifest)
    redone: list = []
    statuses = _sweep(out, configs, redone)
    assert redone == [path.stem] and statuses[path.stem] == "done"
    _consistent(out)
    assert set(_sweep(out, configs).values()) == {"cached"}

"""Faults round 4, kinds 5 and 6, as properties of the benchmark.

5. a sweep's folder is trusted no further than it proves: a run's manifest changed after writing
   (its status, its ``record_version``, any field) is not taken as done, whatever the ``.csv``'s
   checksum says; three files of different grids are not loaded as one; one federation typed
   in several spellings is one federation (the committed grids' spelling is the canonical one);
6. a grid that could never succeed is refused before its first run, naming the method, what it
   needs and the fix.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import execution, store

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = benchmark.BenchmarkProtocol(rounds=2, last_k=1, clients_per_round=2, tuning_seeds=(0,), eval_seeds=(1, 2))
FED = benchmark.parse_federation("dirichlet:0.5", num_clients=4, num_samples=200)
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, str]:
    """A folder with one finished run (FedAvg, 2 rounds, 4 clients) and its key."""
    out = tmp_path_factory.mktemp("swept")
    cfg = execution._config(benchmark.METHODS["fedavg"], FED, PROTOCOL, {"server_lr": 1.0}, 1, "eval")
    statuses = benchmark.run_configs([cfg], out, backend="sequential", progress=False)
    assert list(statuses.values()) == ["done"]
    return out, benchmark.run_key(cfg)


# a change to one field of the manifest: (field, the new value drawn from the old one)
CHANGES = {
    "status": st.sampled_from(["failed", "OK", "ok ", "done", "", None, 1, ["ok"]]),
    "record_version": st.one_of(st.integers(-5, 100).filter(lambda v: v != store.RECORD_VERSION), st.just(None)),
    "num_rows": st.integers(0, 10**6),
    "seconds": st.floats(0, 1e6),
    "csv_sha256": st.text("0123456789abcdef", min_size=64, max_size=64),
}


@settings(SETTINGS, max_examples=40)
@given(data=st.data())
def test_5_a_manifest_changed_after_writing_is_not_done(swept, tmp_path_factory, data):
    out, key = swept
    field = data.draw(st.sampled_from(sorted(CHANGES) + ["missing field"]), label="field")
    copy = tmp_path_factory.mktemp("copy")
    shutil.copytree(out / "runs", copy / "runs")
    path = copy / "runs" / f"{key}.json"
    meta = json.loads(path.read_text())
    if field == "missing field":
        meta.pop(data.draw(st.sampled_from(sorted(k for k in meta if k != "key")), label="dropped"))
    else:
        value = data.draw(CHANGES[field], label=field)
        if meta.get(field) == value:
            return
        meta[field] = value
    path.write_text(json.dumps(meta, indent=1, sort_keys=True))
    status = store._Store(copy).status(key)
    assert status != "done", f"a manifest with {field} changed was taken as done"


NUMBERS = {
    "dirichlet": [0.1, 0.5, 1.0, 0.05],
    "quantity": [1.0, 0.5, 2.0],
    "noisy": [0.8, 0.5, 1.0],
    "shards": [2, 3],
    "clusters": [4, 2],
}


def _spellings(number) -> st.SearchStrategy:
    """Ways to type one number: '0.5', '0.50', '.5', '5e-1', '5E-1', '0.5000'."""
    text = repr(float(number))
    forms = [text, text + "0", f"{float(number):e}", f"{float(number):E}", f"{float(number):.6f}"]
    if text.startswith("0."):
        forms.append(text[1:])
    if float(number).is_integer():
        forms.append(str(int(number)))
    return st.sampled_from([t for t in forms if "+" not in t])  # '+' adds an attacker


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_5_one_federation_in_any_spelling_is_one_federation(data):
    from fedlearn_edu.benchmark.grid import CLASSROOM_FEDERATIONS, ROBUST_FEDERATIONS

    kind = data.draw(st.sampled_from(sorted(NUMBERS)), label="kind")
    number = data.draw(st.sampled_from(NUMBERS[kind]), label="number")
    cases = [data.draw(st.sampled_from([str.lower, str.upper, str.title]), label="case") for _ in range(2)]
    typed = [f"{cases[i](kind)}:{data.draw(_spellings(number), label=f'spelling {i}')}" for i in range(2)]
    if data.draw(st.booleans(), label="with an attacker"):
        attack = data.draw(st.sampled_from(["sign_flip", "alie", "gaussian"]), label="attack")
        fraction = data.draw(st.sampled_from([0.1, 0.3]), label="fraction")
        typed = [
            f"{t}+{c(attack)}:{data.draw(_spellings(fraction), label='fraction spelling')}"
            for t, c in zip(typed, cases)
        ]
    specs = [benchmark.parse_federation(t, num_clients=20) for t in typed]
    assert specs[0] == specs[1], typed  # one name, one run key
    assert execution.run_key(_cfg(specs[0])) == execution.run_key(_cfg(specs[1]))
    with pytest.raises(ValueError, match="federations holds one federation twice"):
        benchmark.sweep._federations(typed, {"num_clients": 20})
    for committed in (*CLASSROOM_FEDERATIONS, *ROBUST_FEDERATIONS):  # their spelling is the canonical one
        assert benchmark.parse_federation(committed).name == committed


def _cfg(spec):
    return execution._config(benchmark.METHODS["fedavg"], spec, PROTOCOL, {"server_lr": 1.0}, 1, "eval")


GRIDS = ("classroom", "lab", "robust")


@functools.lru_cache
def _head_of_records(grid: str, rows: int = 3000) -> bytes:
    """The first ``rows`` records of a committed grid, gzipped: quick to load (the grids' rounds differ)."""
    with gzip.open(ROOT / "benchmarks" / "results" / grid / "records.csv.gz", "rt") as f:
        head = list(itertools.islice(f, rows + 1))
    return gzip.compress("".join(head).encode(), mtime=0)


@settings(SETTINGS, max_examples=6)
@given(grids=st.permutations(GRIDS), data=st.data())
def test_5_files_of_different_grids_are_not_loaded_as_one(tmp_path_factory, grids, data):
    records_of, protocol_of = grids[0], grids[1]
    runs_of = data.draw(st.sampled_from([records_of, protocol_of]), label="runs.csv of")
    out = tmp_path_factory.mktemp("mixed")
    for name, grid in (("protocol.json", protocol_of), ("runs.csv", runs_of)):
        shutil.copy(ROOT / "benchmarks" / "results" / grid / name, out / name)
    (out / "records.csv.gz").write_bytes(_head_of_records(records_of))
    with pytest.raises(ValueError, match="not of one grid"):
        benchmark.load(out)


# --------------------------------------------------------------------------- 6. a grid that can never succeed
@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_6_a_grid_a_method_can_never_run_is_refused_before_the_first_run(tmp_path_factory, data):
    rule = data.draw(st.sampled_from(["krum", "multikrum", "bulyan", "fedvg"]), label="rule")
    out = tmp_path_factory.mktemp("never")
    num_clients = data.draw(st.integers(4, 12), label="num_clients")
    if rule == "fedvg":  # the server's validation set: none
        m = benchmark.Method("fedvg_noval", strategy="fedvg", fixed={"server_lr": 1.0})
        per_round, need = data.draw(st.integers(1, num_clients), label="clients_per_round"), "validation"
    else:
        f = data.draw(st.one_of(st.none(), st.integers(0, 3)), label="f")
        least = 3 if f is None else (2 * f + 3 if rule != "bulyan" else 4 * f + 3)
        per_round = data.draw(st.integers(1, least - 1), label="clients_per_round")
        m = benchmark.Method(f"{rule}_f{f}", strategy=rule, fixed={} if f is None else {"f": f})
        need = f"at least {least} clients per round"
    protocol = benchmark.BenchmarkProtocol(
        rounds=1, last_k=1, clients_per_round=per_round, tuning_seeds=(0,), eval_seeds=(1, 2)
    )
    with pytest.raises(ValueError) as info:
        benchmark.run(
            [m], ["iid"], out=out, protocol=protocol, num_clients=num_clients, num_samples=200, progress=False
        )
    message = str(info.value)
    assert repr(m.name) in message and need in message, message
    assert not list((out / "runs").glob("*.json")) if (out / "runs").exists() else True  # no run was started

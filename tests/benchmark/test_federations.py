"""The benchmark's attack axis, and the shape of the committed robust grid (benchmarks/results/robust).

Its summary and a sample of its runs are checked against the code, bit for bit, with the
classroom grid's in tests/benchmark/test_benchmark_records.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import execution

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "robust"
COLUMNS = ("mean", "std", "worst10", "best10", "loss", "train_loss")


def test_an_attack_is_part_of_the_federation_and_of_its_key():
    plain = benchmark.parse_federation("dirichlet:0.5")
    attacked = benchmark.parse_federation("dirichlet:0.5+sign_flip:0.3")
    assert attacked.partition == "dirichlet" and attacked.partition_params == {"alpha": 0.5}
    assert (attacked.attack, attacked.attack_fraction, attacked.attack_params) == ("sign_flip", 0.3, {})
    assert benchmark.parse_federation("iid+gaussian:0.1").attack_params == {"sigma": 1.0}
    # without an attacker, the federation's configuration (hence every key) is the one before the axis existed
    assert set(plain.config()) == {
        "name",
        "dataset",
        "partition",
        "partition_params",
        "num_clients",
        "model",
        "noisy_clients",
        "noise_fraction",
        "num_samples",
    }
    assert attacked.config()["attack"] == "sign_flip"
    p = benchmark.BenchmarkProtocol()
    m = benchmark.METHODS["fedavg"]
    keys = {benchmark.run_key(execution._config(m, f, p, {"server_lr": 1.0}, 1, "eval")) for f in (plain, attacked)}
    assert len(keys) == 2


@pytest.mark.parametrize(
    "text, match",
    [
        ("dirichlet:0.5+sign_flip", "KIND:FRACTION"),
        ("dirichlet:0.5+nonsense:0.1", "attack must be one of"),
        ("dirichlet:0.5+sign_flip:1.5", "attack_fraction"),
        ("dirichlet:0.5+model_replacement:0.1", "attack must be one of"),
    ],
)
def test_bad_attacks_are_refused_by_name(text, match):
    with pytest.raises(ValueError, match=match):
        benchmark.parse_federation(text)


def test_an_attacked_run_differs_and_is_reproduced():
    p = benchmark.BenchmarkProtocol(rounds=3, clients_per_round=4, last_k=2)
    m = benchmark.fixed_step("fedavg", 1.0)
    common = {"num_clients": 4, "num_samples": 300}
    runs = {}
    for text in ("dirichlet:0.5", "dirichlet:0.5+sign_flip:0.5"):
        cfg = execution._config(m, benchmark.parse_federation(text, **common), p, m.candidates()[0], 1, "eval")
        runs[text] = [benchmark.execute(cfg) for _ in range(2)]
        assert all(r["status"] == "ok" for r in runs[text]), runs[text]
        assert json.dumps(runs[text][0]["rows"]) == json.dumps(runs[text][1]["rows"])  # NaN == NaN in text
    assert runs["dirichlet:0.5"][0]["rows"][-1] != runs["dirichlet:0.5+sign_flip:0.5"][0]["rows"][-1]


def test_a_fixed_step_is_not_tuned():
    m = benchmark.fixed_step("fedvg", 2.0)
    assert (
        m.candidates() == [{"server_lr": 2.0}] and m.server_validation == benchmark.METHODS["fedvg"].server_validation
    )
    with pytest.raises(ValueError, match="server_lr"):
        benchmark.fixed_step("fedavg", 0)


def test_untuned_methods_run_no_tuning_run(tmp_path):
    result = benchmark.run(
        [benchmark.fixed_step("fedavg", 1.0), benchmark.fixed_step("median", 1.0)],
        ["dirichlet:0.5+label_flip:0.25"],
        out=tmp_path,
        backend="sequential",
        num_clients=4,
        num_samples=300,
        rounds=2,
        last_k=1,
        clients_per_round=4,
        eval_seeds=(3, 4),
        progress=False,
    )
    assert set(result.runs.phase) == {"eval"} and len(result.runs) == 4
    assert result.picks == {("dirichlet:0.5+label_flip:0.25", m): {"server_lr": 1.0} for m in ("fedavg", "median")}
    assert (result.records.attack == "label_flip").all()


# --------------------------------------------------------------------------- the committed grid


@pytest.fixture(scope="module")
def result():
    return benchmark.load(RECORDS)


def test_the_records_are_the_robust_grid(result):
    runs, p = result.runs, result.protocol
    assert (runs.status == "ok").all() and set(runs.phase) == {"eval"}  # no method is tuned
    assert len(p.eval_seeds) >= 3
    assert list(dict.fromkeys(runs.method)) == list(benchmark.ROBUST_METHODS)
    assert list(dict.fromkeys(runs.federation)) == list(benchmark.ROBUST_FEDERATIONS)
    assert (runs.groupby(["federation", "method"]).seed.nunique() == len(p.eval_seeds)).all()
    configs = [json.loads(c) for c in runs.config]
    assert [benchmark.run_key(c) for c in configs] == list(runs.run_key)
    assert all(c["settings"]["server_lr"] == 1.0 for c in configs)
    assert benchmark.records_folder("robust", download=False).resolve() == RECORDS.resolve()


@pytest.mark.parametrize(
    "text, clients, match",
    [
        ("dirichlet:0.5+sign_flip:0.01", 4, r"attack_fraction \(sign_flip\): .* = 0 attackers; no client would attack"),
        ("dirichlet:0.5+label_flip:0.1", 4, r"round\(0.1 \* 4\) = 0 attackers"),
        ("dirichlet:0.5+alie:0.9", 4, r"attack_fraction \(alie\): .* = 4 attackers; no client would stay honest"),
        ("iid+gaussian:0.99", 20, r"round\(0.99 \* 20\) = 20 attackers"),
    ],
)
def test_an_attack_fraction_that_rounds_to_none_or_all_is_refused(text, clients, match):
    """Was: 0 attackers and records identical to the clean federation's labelled as attacked, or no honest client."""
    with pytest.raises(ValueError, match=match):
        benchmark.parse_federation(text, num_clients=clients)
    kind, fraction = text.split("+")[1].split(":")
    with pytest.raises(ValueError, match=match):
        benchmark.FederationSpec(text, num_clients=clients, attack=kind, attack_fraction=float(fraction))
    with pytest.raises(ValueError, match=r"^federations: .*" + match):
        benchmark.run(["fedavg"], [text], num_clients=clients, out="/nonexistent-never-created", progress=False)


def test_the_robust_grid_s_fractions_keep_attackers_and_honest_clients():
    for text in benchmark.ROBUST_FEDERATIONS:
        spec = benchmark.parse_federation(text)  # 20 clients: 10 % is 2 attackers, 30 % is 6
        assert spec.attack == "" or 0 < round(spec.attack_fraction * spec.num_clients) < spec.num_clients
    assert benchmark.parse_federation("dirichlet:0.5+sign_flip:0.25", num_clients=4).attack_fraction == 0.25

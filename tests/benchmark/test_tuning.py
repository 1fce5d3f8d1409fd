"""select(): the tuning pick, and the one rule for a failed run (it scores chance accuracy)."""

from __future__ import annotations

import json

import pandas as pd

from fedlearn_edu import benchmark


def _tune_records(scores: dict, rounds: int = 5) -> pd.DataFrame:
    """Tuning records of FedAvg on ``dirichlet:0.1``: ``scores[server_lr] = {seed: accuracy}`` (a seed left
    out: that run failed)."""
    rows = []
    for lr, per_seed in scores.items():
        for seed, acc in per_seed.items():
            for t in range(1, rounds + 1):
                settings = json.dumps({"server_lr": lr}, sort_keys=True)
                rows.append(
                    {
                        "federation": "dirichlet:0.1",
                        "method": "fedavg",
                        "settings": settings,
                        "seed": seed,
                        "round": t,
                        "mean": acc,
                    }
                )
    return pd.DataFrame(rows)


def _pick(scores):
    m, f = benchmark.METHODS["fedavg"], benchmark.parse_federation("dirichlet:0.1")
    return benchmark.select(_tune_records(scores), [m], [f], benchmark.BenchmarkProtocol())[("dirichlet:0.1", "fedavg")]


def test_a_failed_tuning_run_scores_chance_accuracy_like_a_failed_evaluation_run():
    # step 2 fails on one seed: (0.9 + 0.9 + 0.1) / 3 = 0.633 (digits: 10 classes) beats step 1's 0.6;
    # under a rule that scored the failure -inf, step 1 would be picked
    assert _pick({1.0: {0: 0.6, 1: 0.6, 2: 0.6}, 2.0: {0: 0.9, 1: 0.9}}) == {"server_lr": 2.0}
    # at 0.7 a failure costs more than the other step's deficit: (0.7 + 0.7 + 0.1) / 3 = 0.5 < 0.6
    assert _pick({1.0: {0: 0.6, 1: 0.6, 2: 0.6}, 2.0: {0: 0.7, 1: 0.7}}) == {"server_lr": 1.0}


def test_a_grid_where_every_run_failed_has_no_pick():
    assert _pick({}) is None

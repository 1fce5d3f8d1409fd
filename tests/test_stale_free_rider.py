"""The stale free-rider: it sends the previous round's global update theta_t - theta_{t-1} as its own."""

from __future__ import annotations

import pytest
import torch

from fedlearn_edu import IFCA, Attack, FedAvg, federated_dataset, make_model, simulate

KW = dict(rounds=4, clients_per_round=6, lr=0.1, batch_size=16, progress=False, seed=2, device="cpu")


@pytest.fixture(scope="module")
def fed():
    return federated_dataset("digits", num_clients=8, alpha=0.5, seed=0)


def _model(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)


class _Spy(FedAvg):
    """FedAvg that records, each round, theta_t and the updates it aggregates (test only)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def direction(self, server_state, updates):
        theta = {k: v.clone() for k, v in server_state["params"].items()}
        self.seen.append(
            (updates.round, updates.client_ids.clone(), theta, {k: v.clone() for k, v in updates.deltas.items()})
        )
        return super().direction(server_state, updates)


def test_apply_sends_the_last_global_step():
    g = torch.Generator().manual_seed(0)
    d = {"w": torch.randn(4, 3, 2, generator=g), "b": torch.randn(4, 3, generator=g)}
    before = {k: v.clone() for k, v in d.items()}
    theta = {"w": torch.randn(3, 2, generator=g), "b": torch.randn(3, generator=g)}
    prev = {"w": torch.randn(3, 2, generator=g), "b": torch.randn(3, generator=g)}
    ids, att = torch.tensor([1, 2, 5, 6]), torch.tensor([2, 6])
    a = Attack("stale_free_rider")
    out = a.apply(d, ids, att, 3, theta, 1.0, prev)
    first = a.apply(d, ids, att, 1, theta, 1.0, None)
    for k in d:
        assert torch.equal(d[k], before[k])
        assert torch.equal(out[k][[0, 2]], d[k][[0, 2]]) and torch.equal(first[k][[0, 2]], d[k][[0, 2]])
        for r in (1, 3):
            assert torch.equal(out[k][r], theta[k] - prev[k])
            assert not bool(first[k][r].any())  # round 1: no previous model, a zero update
    assert a.needs_previous and not Attack("free_rider").needs_previous
    assert a.describe() == "stale_free_rider(fraction=0.1, seed=0)"


def test_in_a_run_the_attackers_replay_the_previous_global_update(fed):
    attack = Attack("stale_free_rider", fraction=0.5, seed=1)
    spy = _Spy()
    h = simulate(fed, _model(fed), spy, attack=attack, engine="loop", **KW)
    bad = set(attack.attackers(len(fed)).tolist())
    assert h.attackers.tolist() == sorted(bad) and len(bad) == 4
    checked = 0
    for (_t, ids, theta, deltas), prev in zip(spy.seen, [None, *spy.seen[:-1]]):
        for r, i in enumerate(ids.tolist()):
            for k in deltas:
                if i not in bad:
                    assert bool(deltas[k][r].any())  # honest clients trained
                elif prev is None:
                    assert not bool(deltas[k][r].any())
                else:
                    assert torch.equal(deltas[k][r], theta[k] - prev[2][k])
                    checked += 1
    assert checked > 0
    honest = simulate(fed, _model(fed), FedAvg(), engine="loop", **KW)
    zero = simulate(fed, _model(fed), FedAvg(), attack=Attack("free_rider", fraction=0.5, seed=1), engine="loop", **KW)
    for other in (honest, zero):
        assert any(not torch.equal(h.final_params[k], other.final_params[k]) for k in h.final_params)


def test_engines_agree_and_a_resumed_run_is_bitwise_the_same(fed, tmp_path):
    attack = Attack("stale_free_rider", fraction=0.5, seed=1)
    a = simulate(fed, _model(fed), FedAvg(), attack=attack, engine="loop", **KW)
    b = simulate(fed, _model(fed), FedAvg(), attack=attack, engine="vmap", **KW)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    assert a.attackers.tolist() == b.attackers.tolist()
    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), FedAvg(), attack=attack, checkpoint=path, engine="loop", **dict(KW, rounds=2))
    assert "attack_state" in torch.load(path, weights_only=True)
    resumed = simulate(fed, _model(fed), FedAvg(), attack=attack, checkpoint=path, resume=True, engine="loop", **KW)
    assert all(torch.equal(a.final_params[k], resumed.final_params[k]) for k in a.final_params)


def test_a_strategy_without_one_global_model_is_refused(fed):
    with pytest.raises(ValueError, match="stale free-rider attack aims at one global model; ifca keeps K cluster"):
        simulate(fed, _model(fed), IFCA(2), attack=Attack("stale_free_rider"), **KW)

"""Attacks as a federation's behaviour: seeded attackers, each kind's update, both engines, History.attackers."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
import torch

from fedlearn_edu import IFCA, Attack, CenteredClipping, FedAvg, Median, federated_dataset, make_model, simulate
from fedlearn_edu.aggregators import fedavg
from fedlearn_edu.attacks import ATTACKS, alie_z
from fedlearn_edu.data import reverse_labels

KW = dict(rounds=2, clients_per_round=5, lr=0.1, batch_size=16, progress=False, seed=2, device="cpu")


@pytest.fixture(scope="module")
def fed():
    return federated_dataset("digits", num_clients=8, alpha=0.5, seed=0)


def _model(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)


def _deltas(m=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(m, 3, 2, generator=g), "fc.bias": torch.randn(m, 3, generator=g)}


def test_attackers_are_chosen_by_the_attacks_seed():
    a = Attack("sign_flip", fraction=0.3, seed=1)
    ids = a.attackers(20)
    assert len(ids) == 6 and torch.equal(ids, ids.sort().values) and len(set(ids.tolist())) == 6
    assert torch.equal(ids, Attack("gaussian", fraction=0.3, seed=1).attackers(20))  # the kind does not matter
    assert not torch.equal(ids, Attack("sign_flip", fraction=0.3, seed=2).attackers(20))
    assert len(Attack("free_rider", fraction=0.05).attackers(20)) == 1
    assert len(Attack("free_rider", fraction=0.95).attackers(20)) == 19


def test_each_update_level_kind():
    d = _deltas()
    before = {k: v.clone() for k, v in d.items()}
    ids = torch.tensor([0, 3, 4, 7, 9, 11])
    att = torch.tensor([3, 9, 12])  # rows 1 and 4 attack
    bad, good = [1, 4], [0, 2, 3, 5]
    flip = Attack("sign_flip", scale=2.0).apply(d, ids, att, 1)
    scale = Attack("scale", scale=3.0).apply(d, ids, att, 1)
    free = Attack("free_rider").apply(d, ids, att, 1)
    gauss = Attack("gaussian", sigma=0.5, seed=4).apply(d, ids, att, 1)
    alie = Attack("alie").apply(d, ids, att, 1)
    for k, v in d.items():
        assert torch.equal(v, before[k])  # the input is not modified
        for out in (flip, scale, free, gauss, alie):
            assert torch.equal(out[k][good], v[good])
        assert torch.equal(flip[k][bad], -2.0 * v[bad])
        assert torch.equal(scale[k][bad], 3.0 * v[bad])
        assert not bool(free[k][bad].any())
        h = v[good].double().numpy()
        z = NormalDist().inv_cdf((6 - (4 - 2)) / 6)  # s = floor(6/2 + 1) - 2 = 2
        ref = h.mean(0) - z * h.std(0)
        for r in bad:
            np.testing.assert_allclose(alie[k][r].numpy(), ref, rtol=1e-6, atol=1e-6)
    # Gaussian: seeded by (attack seed, round, client); N(0, sigma^2)
    again = Attack("gaussian", sigma=0.5, seed=4).apply(d, ids, att, 1)
    other_round = Attack("gaussian", sigma=0.5, seed=4).apply(d, ids, att, 2)
    assert all(torch.equal(gauss[k], again[k]) for k in d)
    assert not torch.equal(gauss["fc.weight"][bad], other_round["fc.weight"][bad])
    big = Attack("gaussian", sigma=0.5).apply({"w": torch.zeros(2, 20000)}, torch.tensor([0, 1]), torch.tensor([1]), 1)
    assert abs(float(big["w"][1].std()) - 0.5) < 0.01 and not bool(big["w"][0].any())
    # no attacker selected this round: the same object back
    assert Attack("sign_flip").apply(d, ids, torch.tensor([5]), 1) is d


def test_alie_z_follows_the_paper():
    assert alie_z(50, 24) == pytest.approx(NormalDist().inv_cdf(48 / 50))  # s = 26 - 24 = 2
    assert alie_z(10, 2) == pytest.approx(NormalDist().inv_cdf(6 / 10))
    assert alie_z(10, 8) == pytest.approx(NormalDist().inv_cdf(9 / 10))  # s clamped to 1


def test_model_replacement_installs_the_target_under_fedavg():
    """Bagdasaryan et al.: with the others' updates ~ 0 and equal weights, (m / eta_s)(X - theta_t)
    makes FedAvg's step land on X."""
    theta = {"fc.weight": torch.randn(3, 2), "fc.bias": torch.randn(3)}
    target = {k: torch.randn_like(v) for k, v in theta.items()}
    d = {k: torch.zeros(5, *v.shape) for k, v in theta.items()}
    out = Attack("model_replacement", target=target).apply(d, torch.arange(5), torch.tensor([2]), 1, theta, 0.5)
    step = fedavg(out, torch.ones(5))
    for k in theta:
        torch.testing.assert_close(theta[k] + 0.5 * step[k], target[k])


def test_bad_attacks_are_refused(fed):
    with pytest.raises(ValueError, match="kind must be one of"):
        Attack("flip")
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\) \(use attack=None .*\), got 1.5"):
        Attack("scale", fraction=1.5)
    with pytest.raises(ValueError, match="needs target="):
        Attack("model_replacement")
    with pytest.raises(TypeError, match="attack must be a fedlearn_edu.attacks.Attack"):
        simulate(fed, _model(fed), FedAvg(), attack="sign_flip", **KW)
    with pytest.raises(ValueError, match="aims at one global model; ifca keeps K cluster models"):
        simulate(fed, _model(fed), IFCA(2), attack=Attack("model_replacement", target={}), **KW)


def test_label_flip_is_the_reversed_federation(fed):
    attack = Attack("label_flip", fraction=0.25, seed=3)
    ids = attack.attackers(len(fed)).tolist()
    flipped = reverse_labels(fed, ids)
    for i, (a, b) in enumerate(zip(fed, flipped)):
        assert torch.equal(b.train_y, 9 - a.train_y if i in ids else a.train_y) and torch.equal(a.test_y, b.test_y)
        assert b.info["attacker"] == (i in ids)
    h = simulate(fed, _model(fed), FedAvg(), attack=attack, engine="loop", **KW)
    ref = simulate(flipped, _model(fed), FedAvg(), engine="loop", **KW)
    assert all(torch.equal(h.final_params[k], ref.final_params[k]) for k in ref.final_params)
    assert h.attackers.tolist() == ids and ref.attackers is None
    assert h.config["attack"].startswith("label_flip(fraction=0.25, seed=3")


def test_an_identity_attack_is_the_honest_run_bitwise(fed):
    h = simulate(fed, _model(fed), FedAvg(), attack=Attack("scale", fraction=0.5, scale=1.0), engine="loop", **KW)
    ref = simulate(fed, _model(fed), FedAvg(), engine="loop", **KW)
    assert all(torch.equal(h.final_params[k], ref.final_params[k]) for k in ref.final_params)
    assert "attack" not in ref.config


def _target(fed):
    return {k: torch.zeros_like(v) for k, v in _model(fed).state_dict().items()}


@pytest.mark.parametrize("kind", ATTACKS)
def test_loop_and_vmap_engines_give_the_same_attacked_run(fed, kind):
    extra = {"target": _target(fed)} if kind == "model_replacement" else {}
    if kind in ("sign_flip", "scale"):  # scale is theirs only (another kind refuses it)
        extra["scale"] = 5.0
    attack = Attack(kind, fraction=0.25, seed=1, **extra)
    a = simulate(fed, _model(fed), Median(), attack=attack, engine="loop", **KW)
    b = simulate(fed, _model(fed), Median(), attack=attack, engine="vmap", **KW)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a.client_accuracy, b.client_accuracy, atol=1e-6)
    assert a.attackers.tolist() == attack.attackers(len(fed)).tolist() == b.attackers.tolist()
    honest = simulate(fed, _model(fed), Median(), engine="loop", **KW)
    assert any(not torch.equal(a.final_params[k], honest.final_params[k]) for k in a.final_params)


def test_an_attacked_run_resumes_bit_identically_and_refuses_another_attack(fed, tmp_path):
    attack = Attack("alie", fraction=0.25, seed=1)
    kw = dict(KW, engine="loop", rounds=3)
    path = tmp_path / "run.pt"
    full = simulate(fed, _model(fed), CenteredClipping(tau=0.3), attack=attack, **kw)
    simulate(fed, _model(fed), CenteredClipping(tau=0.3), attack=attack, checkpoint=path, **dict(kw, rounds=2))
    resumed = simulate(fed, _model(fed), CenteredClipping(tau=0.3), attack=attack, checkpoint=path, resume=True, **kw)
    assert all(torch.equal(full.final_params[k], resumed.final_params[k]) for k in full.final_params)
    assert all(
        torch.equal(full.final_server_state["center"][k], resumed.final_server_state["center"][k])
        for k in full.final_params
    )
    assert resumed.attackers.tolist() == full.attackers.tolist()
    with pytest.raises(ValueError, match="its attack is"):
        simulate(
            fed, _model(fed), CenteredClipping(tau=0.3), attack=Attack("alie", 0.5), checkpoint=path, resume=True, **kw
        )


# --------------------------------------------------------------------------- the stale free-rider
# it sends the previous round's global update theta_t - theta_{t-1} as its own
STALE = dict(KW, rounds=4, clients_per_round=6)


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
    h = simulate(fed, _model(fed), spy, attack=attack, engine="loop", **STALE)
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
    honest = simulate(fed, _model(fed), FedAvg(), engine="loop", **STALE)
    zero = simulate(
        fed, _model(fed), FedAvg(), attack=Attack("free_rider", fraction=0.5, seed=1), engine="loop", **STALE
    )
    for other in (honest, zero):
        assert any(not torch.equal(h.final_params[k], other.final_params[k]) for k in h.final_params)


def test_engines_agree_and_a_resumed_run_is_bitwise_the_same(fed, tmp_path):
    attack = Attack("stale_free_rider", fraction=0.5, seed=1)
    a = simulate(fed, _model(fed), FedAvg(), attack=attack, engine="loop", **STALE)
    b = simulate(fed, _model(fed), FedAvg(), attack=attack, engine="vmap", **STALE)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    assert a.attackers.tolist() == b.attackers.tolist()
    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), FedAvg(), attack=attack, checkpoint=path, engine="loop", **dict(STALE, rounds=2))
    assert "attack_state" in torch.load(path, weights_only=True)
    resumed = simulate(fed, _model(fed), FedAvg(), attack=attack, checkpoint=path, resume=True, engine="loop", **STALE)
    assert all(torch.equal(a.final_params[k], resumed.final_params[k]) for k in a.final_params)


def test_a_strategy_without_one_global_model_is_refused(fed):
    with pytest.raises(ValueError, match="stale free-rider attack aims at one global model; ifca keeps K cluster"):
        simulate(fed, _model(fed), IFCA(2), attack=Attack("stale_free_rider"), **STALE)


def test_fractions_that_round_to_no_attacker_or_to_all_clients_are_refused(fed):
    from fedlearn_edu.attacks import num_attackers

    assert num_attackers(0.3, 20) == 6 and num_attackers(0.25, 4) == 1 and num_attackers(0.75, 4) == 3
    # was: 0 attackers, a run identical to the clean one labelled as attacked
    with pytest.raises(ValueError, match=r"^attack fraction=0.01 with num_clients=4 gives round\(0.01 \* 4\) = 0 "):
        Attack("sign_flip", 0.01).attackers(4)
    with pytest.raises(
        ValueError,
        match=r"fraction=0.01 with num_clients=8 .* = 0 attackers; no client would attack: "
        r"choose a fraction in \[1/8, 7/8\]",
    ):
        simulate(fed, _model(fed), FedAvg(), attack=Attack("sign_flip", 0.01), **KW)
    # was: every client an attacker (ALIE then sent the honest updates)
    with pytest.raises(
        ValueError, match=r"fraction=0.95 with num_clients=8 .* = 8 attackers; no client would stay honest"
    ):
        simulate(fed, _model(fed), FedAvg(), attack=Attack("alie", 0.95), **KW)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\)"):
        Attack("alie", 1.0)  # all clients, whatever N
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\)"):
        Attack("sign_flip", 0.0)  # none, whatever N
    with pytest.raises(ValueError, match="an attack needs at least 2 clients"):
        num_attackers(0.5, 1)
    with pytest.raises(TypeError, match="num_clients must be an integer"):
        num_attackers(0.5, 4.0)
    with pytest.raises(TypeError, match="fraction must be a real number"):
        num_attackers("0.5", 4)


def test_a_target_is_for_model_replacement_only():
    with pytest.raises(
        ValueError, match=r"^target is for kind='model_replacement' only, got a target with kind='sign_flip'"
    ):
        Attack("sign_flip", 0.25, target=object())  # was: accepted, then describe() raised AttributeError
    with pytest.raises(ValueError, match=r"^target is for kind='model_replacement' only"):
        Attack("scale", 0.25, target={"w": torch.zeros(2)})


# --------------------------------------------------------------------------- an attack as a transform
def test_an_attack_is_a_transform_with_its_own_state():
    """init -> AttackState; update(deltas, ids, state, t, theta_t, eta_s) -> (apply's updates, next state)."""
    from fedlearn_edu.attacks import AttackState

    g = torch.Generator().manual_seed(1)
    d = {"w": torch.randn(4, 3, 2, generator=g), "b": torch.randn(4, 3, generator=g)}
    thetas = [{"w": torch.randn(3, 2, generator=g), "b": torch.randn(3, generator=g)} for _ in range(3)]
    ids = torch.tensor([0, 2, 5, 7])
    for kind in ("sign_flip", "gaussian", "alie", "free_rider", "stale_free_rider"):
        extra = {"scale": 2.0} if kind == "sign_flip" else {}  # another kind refuses a scale it would ignore
        attack = Attack(kind, fraction=0.5, seed=3, **extra)
        state = attack.init(8)
        assert isinstance(state, AttackState) and torch.equal(state.attackers, attack.attackers(8))
        assert state.previous is None
        previous = None
        for t, theta in enumerate(thetas, start=1):
            out, new = attack.update(d, ids, state, t, theta, 0.5)
            ref = attack.apply(d, ids, attack.attackers(8), t, theta, 0.5, previous)
            assert all(torch.equal(out[k], ref[k]) for k in d)
            assert torch.equal(new.attackers, state.attackers)
            if kind == "stale_free_rider":  # it keeps theta_t (a copy) for round t + 1
                assert all(torch.equal(new.previous[k], theta[k]) and new.previous[k] is not theta[k] for k in d)
                previous = theta
            else:
                assert new.previous is None
            state = new
    flip = Attack("label_flip", fraction=0.5)
    state = flip.init(8)
    assert flip.update(d, ids, state, 1, thetas[0]) == (d, state)  # data level: the updates untouched


def test_poison_reverses_the_attackers_labels_for_label_flip_only(fed):
    flip = Attack("label_flip", fraction=0.25, seed=3)
    state = flip.init(len(fed))
    poisoned = flip.poison(fed, state)
    ref = reverse_labels(fed, state.attackers.tolist())
    assert all(torch.equal(a.train_y, b.train_y) for a, b in zip(poisoned, ref))
    other = Attack("sign_flip", fraction=0.25, seed=3)
    assert other.poison(fed, other.init(len(fed))) is fed


def test_init_refuses_an_attack_on_one_model_for_a_strategy_without_one():
    with pytest.raises(ValueError, match="model-replacement attack aims at one global model; ifca keeps K cluster"):
        Attack("model_replacement", target={}).init(8, IFCA(2))
    assert len(Attack("stale_free_rider", 0.5).init(8, FedAvg()).attackers) == 4

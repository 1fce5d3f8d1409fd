"""The decentralised strategies (:mod:`fedlearn_edu.strategies.decentralized`): Gossip and DAC keep one
model per client."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlearn_edu import DAC, Gossip, LocalOnly, shifted_federation, simulate
from fedlearn_edu.engine import LocalResult, LocalTraining
from fedlearn_edu.params import get_params, repeat_params
from fedlearn_edu.strategies import ClientUpdates, ClientWork
from tests.strategies.test_drift import KW, _model


# -------------------------------------------------------------- decentralised
class _StillEngine:
    """A test double: 'training' leaves every client's model where it starts (mixing only)."""

    name = "still"

    def train(self, model, global_params, datasets, config, seeds, start=None, linear=None):
        m = len(datasets)
        p = start if start is not None else repeat_params(global_params, m)
        return LocalResult({k: v.clone() for k, v in p.items()}, torch.zeros(m), torch.zeros(m, dtype=torch.long))


def test_gossip_with_full_participation_converges_to_the_average():
    n = 8
    s = Gossip(edge_prob=0.4)
    theta = {"w": torch.zeros(3, dtype=torch.float64)}
    state, _ = s.init_state(theta, None, n, seed=3)
    models = {"w": torch.randn(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)}
    state = {**state, "models": models}
    x0 = models["w"].numpy().copy()
    W = state["mixing"].numpy()
    np.testing.assert_allclose(W.sum(0), 1)
    np.testing.assert_allclose(W.sum(1), 1)
    data = [(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long))] * n
    for t in range(1, 301):
        work = ClientWork(t, torch.arange(n), data, [0] * n, LocalTraining(), None, _StillEngine(), 0, torch.ones(n))
        out = s.client_update(work, state, {})
        upd = ClientUpdates(t, torch.arange(n), out.deltas, torch.ones(n), out.train_loss, None, out.signals)
        state, _ = s.aggregate(state, upd)
        models = state["models"]
        if t == 3:
            np.testing.assert_allclose(models["w"].numpy(), np.linalg.matrix_power(W, 3) @ x0, rtol=1e-12)
    np.testing.assert_allclose(models["w"].numpy(), np.tile(x0.mean(0), (n, 1)), atol=1e-8)


def test_gossip_and_dac_keep_one_model_per_client(fed):
    for s in (Gossip(num_neighbours=2), DAC(2)):
        h = simulate(fed, _model(fed), s, **KW)
        assert h.evaluated == "personal"
        assert all(v.shape[0] == len(fed) for v in h.final_params.values())
        # clients never selected still hold theta_0
        theta = get_params(_model(fed))
        for i in set(range(len(fed))) - set(np.concatenate(h.selected).tolist()):
            assert all(torch.equal(h.final_params[k][i], theta[k]) for k in theta)


def test_dac_scores_are_inverse_losses_and_it_finds_its_cluster():
    fed = shifted_federation("digits", "label", 2, 4, samples_per_client=40, seed=0)
    model = _model(fed)
    theta = get_params(model)
    run = dict(rounds=1, clients_per_round=len(fed), lr=0.1, batch_size=8, progress=False, seed=0, local_epochs=2)
    s = DAC(num_neighbours=2, tau=30.0, warmup=False)
    h = simulate(fed, model, s, **run)
    nb = h.diagnostics[0]["neighbours"]
    with torch.no_grad():  # without the warm-up, round 1 scores theta_0 everywhere: equal scores
        for i in range(len(fed)):
            c = fed[i]
            want = 1 / float(F.cross_entropy(torch.func.functional_call(model, theta, (c.train_x,)), c.train_y))
            for j in nb[i].tolist():
                assert float(h.final_server_state["similarity"][i, j]) == pytest.approx(want, rel=1e-5)
    s2 = DAC(num_neighbours=2, tau=30.0)
    h2 = simulate(fed, model, s2, **{**run, "rounds": 12})
    cluster = torch.arange(len(fed)) // 4
    late = torch.stack([d["neighbours"] for d in h2.diagnostics[-4:]])  # Tensor[4, N, 2]
    same = (cluster[late] == cluster.view(1, -1, 1)).double().mean()
    assert float(same) > 0.9  # random sampling would give 3/7


def test_dac_warms_up_every_client_before_the_first_scoring_as_the_authors_code():
    """train_DAC (github.com/edvinli/DAC, utils.py) trains every client once, then scores: round 1
    trains alone (the models of LocalOnly's first round), round 2 scores the trained models."""
    fed = shifted_federation("digits", "label", 2, 3, samples_per_client=30, seed=0)
    model = _model(fed)
    run = dict(clients_per_round=len(fed), lr=0.1, batch_size=8, progress=False, seed=0, local_epochs=2)
    one = DAC(num_neighbours=2)
    h1 = simulate(fed, model, one, rounds=1, **run)
    assert h1.diagnostics[0]["neighbours"].shape == (len(fed), 0)
    assert torch.count_nonzero(h1.final_server_state["similarity"]) == 0  # no scores yet
    alone = simulate(fed, model, LocalOnly(), rounds=1, **run)
    np.testing.assert_array_equal(h1.client_accuracy, alone.client_accuracy)
    two = DAC(num_neighbours=2)
    h2 = simulate(fed, model, two, rounds=2, **run)
    nb = h2.diagnostics[1]["neighbours"]
    warmed = h1.final_params  # Tensor[N, ...]: the models after the warm-up
    with torch.no_grad():
        for i in range(len(fed)):
            c = fed[i]
            for j in nb[i].tolist():
                out = torch.func.functional_call(model, {k: v[j] for k, v in warmed.items()}, (c.train_x,))
                assert float(h2.final_server_state["similarity"][i, j]) == pytest.approx(
                    1 / float(F.cross_entropy(out, c.train_y)), rel=1e-5
                )
    similarity = h2.final_server_state["similarity"]
    scores = similarity[similarity > 0]
    assert float(scores.max() - scores.min()) > 0.05  # trained models: the scores differ, unlike theta_0's


def test_dac_var_temperature_is_indexed_as_the_authors_code():
    """The authors compute tau_new = tau_function(round, tau, 0.2) (utils.py: 2a / (1 + exp(-b x)) - a + 1)
    at the end of scoring round ``round`` (from 0) and draw with it in the next: the draw of scoring
    round r uses tau_function(r - 1). Driver round t is scoring round t - 2 (warm-up) or t - 1."""

    def tau_function(x, a, b):
        return 2 * a / (1 + np.exp(-b * x)) - a + 1

    var, no_warmup = DAC(tau=30.0, tau_rate=0.2), DAC(tau=30.0, tau_rate=0.2, warmup=False)
    for t in range(3, 40):
        assert var.temperature(t) == pytest.approx(tau_function(t - 3, 30.0, 0.2), rel=1e-14)
        assert no_warmup.temperature(t) == pytest.approx(tau_function(t - 2, 30.0, 0.2), rel=1e-14)
    assert var.scoring_round(1) == -1 and var.scoring_round(2) == 0 and no_warmup.scoring_round(1) == 0
    assert DAC(tau=30.0).temperature(7) == 30.0
    with pytest.raises(TypeError, match="warmup"):
        DAC(warmup=1)


def test_compare_methods_runs_gossip_and_dac_on_request():
    from fedlearn_edu import compare_methods

    fed = shifted_federation("digits", "label", 2, 3, samples_per_client=30, seed=0)
    out = compare_methods(fed, ("fedavg", "gossip", "dac"), model_kwargs={"hidden": (16,)}, num_neighbours=2,
                          rounds=2, batch_size=8, lr=0.1, seed=0)  # fmt: skip
    assert list(out) == ["fedavg", "gossip", "dac"]
    assert out["gossip"].evaluated == out["dac"].evaluated == "personal"
    assert out["dac"].diagnostics[0]["neighbours"].shape == (len(fed), 0)  # round 1: the warm-up
    assert out["dac"].diagnostics[1]["neighbours"].shape == (len(fed), 2)
    with pytest.raises(ValueError, match="Unknown method"):
        compare_methods(fed, ("gosip",), rounds=1)

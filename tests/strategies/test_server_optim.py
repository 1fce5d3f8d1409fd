"""Server optimizers (SGD, momentum, FedOpt's Adam/Yogi/Adagrad) against their update rules written out."""

import numpy as np
import pytest
import torch

from fedlearn_edu import (
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedVG,
    FedYogi,
    ServerAdam,
    ServerMomentum,
    ServerSGD,
    make_strategy,
)
from fedlearn_edu.aggregators import fedvg_aggregate
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.models import make_model
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import STRATEGIES, ClientUpdates, ServerAdagrad, ServerOptimizer, ServerYogi, sgd
from tests.server_steps import Server


def _updates(deltas, n, model=None, round_=1):
    m = next(iter(deltas.values())).shape[0]
    return ClientUpdates(round_, torch.arange(m), deltas, torch.tensor(n), torch.zeros(m), model)


def _rounds(seed=0, rounds=4):
    """A few rounds of random client deltas (float64) for a two-tensor model, and the sizes."""
    g = np.random.default_rng(seed)
    return [{"w": g.normal(size=(3, 2, 3)), "b": g.normal(size=(3, 2)) * 1e-3} for _ in range(rounds)], [5, 1, 2]


def _fedopt_by_hand(kind, x0, rounds, n, eta, b1, b2, tau, uniform=False):
    """Reddi et al. (2021), Algorithm 2, in NumPy: Delta_t = sum p_i Delta_i (``uniform``: the
    Algorithm's own (1/|S|) sum_{i in S} Delta_i), m_t = b1 m + (1-b1) Delta_t,
    v_t per ``kind`` (v_{-1} = tau^2), x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)."""
    p = np.full(len(n), 1 / len(n)) if uniform else np.asarray(n, dtype=float) / np.sum(n)
    x = {k: v.copy() for k, v in x0.items()}
    m = {k: np.zeros_like(v) for k, v in x0.items()}
    v = {k: np.full_like(val, tau**2) for k, val in x0.items()}
    out = []
    for deltas in rounds:
        for k in x:
            d = np.tensordot(p, deltas[k], axes=1)
            m[k] = b1 * m[k] + (1 - b1) * d
            if kind == "adam":
                v[k] = b2 * v[k] + (1 - b2) * d**2
            elif kind == "yogi":
                v[k] = v[k] - (1 - b2) * d**2 * np.sign(v[k] - d**2)
            else:
                v[k] = v[k] + d**2
            x[k] = x[k] + eta * m[k] / (np.sqrt(v[k]) + tau)
        out.append({k: val.copy() for k, val in x.items()})
    return out


@pytest.mark.parametrize("cls, kind", [(FedAdam, "adam"), (FedYogi, "yogi"), (FedAdagrad, "adagrad")])
def test_fedopt_strategies_follow_reddi_et_al(cls, kind):
    rounds, n = _rounds()
    g = np.random.default_rng(1)
    x0 = {"w": g.normal(size=(2, 3)), "b": g.normal(size=2)}
    eta, b1, b2, tau = 0.05, 0.8, 0.95, 1e-2
    want = _fedopt_by_hand(kind, x0, rounds, n, eta, b1, b2, tau)
    s = cls(server_lr=eta, beta1=b1, beta2=b2, tau=tau)
    params = {k: torch.from_numpy(v) for k, v in x0.items()}
    server = Server(s, params)
    for t, deltas in enumerate(rounds):
        upd = _updates({k: torch.from_numpy(v) for k, v in deltas.items()}, n, round_=t + 1)
        params, diag = server.aggregate(upd)
        for k in params:
            np.testing.assert_allclose(params[k].numpy(), want[t][k], rtol=1e-12, atol=1e-14)
    assert diag["weights"].shape == (3,)
    # a fresh server state has fresh moments: the first step again
    first, _ = Server(s, _as_t(x0)).aggregate(_updates(_as_t(rounds[0]), n))
    for k in first:
        np.testing.assert_allclose(first[k].numpy(), want[0][k], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls, kind", [(FedAdam, "adam"), (FedYogi, "yogi"), (FedAdagrad, "adagrad")])
def test_fedopt_uniform_weighting_is_algorithm_2s_plain_mean(cls, kind):
    """``weighting="uniform"``: Delta_t = (1/|S|) sum Delta_i, as Reddi et al.'s Algorithm 2;
    the default weighs by data size, and the two differ when the sizes do (here 5, 1, 2)."""
    rounds, n = _rounds(seed=2)
    x0 = {"w": np.zeros((2, 3)), "b": np.zeros(2)}
    want = _fedopt_by_hand(kind, x0, rounds, n, 0.05, 0.8, 0.95, 1e-2, uniform=True)
    sized = _fedopt_by_hand(kind, x0, rounds, n, 0.05, 0.8, 0.95, 1e-2)
    s = cls(server_lr=0.05, beta1=0.8, beta2=0.95, tau=1e-2, weighting="uniform")
    assert cls().weighting == "size"
    server = Server(s, _as_t(x0))
    for t, deltas in enumerate(rounds):
        params, diag = server.aggregate(_updates(_as_t(deltas), n, round_=t + 1))
        for k in params:
            np.testing.assert_allclose(params[k].numpy(), want[t][k], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(diag["weights"].numpy(), np.full(3, 1 / 3))
    assert not np.allclose(want[-1]["w"], sized[-1]["w"])
    with pytest.raises(ValueError, match="weighting"):
        cls(weighting="equal")


def _as_t(d):
    return {k: torch.from_numpy(v) for k, v in d.items()}


def test_yogi_differs_from_adam_and_adaptivity_bounds_the_first_step():
    """With v_0 = tau^2 the first Adam step is eta (1-b1) d / (sqrt(b2 tau^2 + (1-b2) d^2) + tau),
    whose size stays below eta (1-b1)/sqrt(1-b2) however large the update: the server step is
    scale-free, unlike SGD's."""
    rounds, n = _rounds(seed=3, rounds=2)
    x0 = {"w": np.zeros((2, 3)), "b": np.zeros(2)}
    huge = [{k: 1e6 * v for k, v in r.items()} for r in rounds]
    adam = FedAdam(server_lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    p, _ = Server(adam, _as_t(x0)).aggregate(_updates(_as_t(huge[0]), n))
    assert float(p["w"].abs().max()) <= 0.1 * 0.1 / np.sqrt(0.01) + 1e-12
    adam, yogi = FedAdam(server_lr=0.1), FedYogi(server_lr=0.1)
    sa, sy = Server(adam, _as_t(x0)), Server(yogi, _as_t(x0))
    for t, r in enumerate(rounds):
        pa, _ = sa.aggregate(_updates(_as_t(r), n, round_=t + 1))
        py, _ = sy.aggregate(_updates(_as_t(r), n, round_=t + 1))
    assert not torch.allclose(pa["w"], py["w"])


def test_sgd_and_momentum_optimizers_are_fedavg_and_fedavgm():
    rounds, n = _rounds(seed=5, rounds=3)
    x0 = {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.ones(2, dtype=torch.float64)}
    a, b = FedAvgM(server_lr=0.7, momentum=0.6), FedAvg(optimizer=ServerMomentum(0.7, 0.6))
    sa, sb, v, want = Server(a, dict(x0)), Server(b, dict(x0)), None, dict(x0)
    for t, r in enumerate(rounds):
        pa, _ = sa.aggregate(_updates(_as_t(r), n, round_=t + 1))
        pb, _ = sb.aggregate(_updates(_as_t(r), n, round_=t + 1))
        p = torch.tensor(n, dtype=torch.float64) / sum(n)
        g = {k: -torch.tensordot(p, torch.from_numpy(r[k]), dims=1) for k in r}  # the pseudo-gradient
        v = g if v is None else {k: 0.6 * v[k] + g[k] for k in g}
        want = {k: want[k] - 0.7 * v[k] for k in g}
        for k in want:
            torch.testing.assert_close(pa[k], want[k])
            assert torch.equal(pa[k], pb[k])
    assert a.momentum == 0.6 and a.server_lr == 0.7
    sgd = ServerSGD(0.5)
    out, state = sgd.step({"w": torch.tensor([1.0])}, {"w": torch.tensor([4.0])}, sgd.init_state({}))
    assert out["w"].item() == -1.0 and state == {}


def test_optimizer_is_pure_and_arguments_are_checked():
    """The optimizer keeps nothing: the same (params, g, state) give the same step, twice."""
    rounds, n = _rounds(seed=2, rounds=3)
    x0 = {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}
    a = ServerAdam(0.1)
    p, state = a.step(x0, {k: -torch.from_numpy(rounds[0][k]).mean(0) for k in x0}, a.init_state(x0))
    saved = {m: {k: v.clone() for k, v in d.items()} for m, d in state.items()}
    g = {k: -torch.from_numpy(rounds[1][k]).mean(0) for k in x0}
    (pa, sa), (pb, sb) = a.step(p, g, state), ServerAdam(0.1).step(p, g, state)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert all(torch.equal(sa[m][k], sb[m][k]) for m in sa for k in sa[m])
    assert all(torch.equal(state[m][k], saved[m][k]) for m in state for k in state[m])  # input unchanged
    for bad in (dict(lr=0), dict(beta1=1.0), dict(beta2=-0.1), dict(tau=0)):
        with pytest.raises(ValueError):
            ServerAdam(**bad)
    with pytest.raises(ValueError, match="momentum"):
        ServerMomentum(1.0, 1.0)
    with pytest.raises(TypeError, match="ServerOptimizer"):
        FedAvg(optimizer="adam")
    assert isinstance(make_strategy("fedadam"), FedAdam) and isinstance(make_strategy("FedYogi"), FedYogi)
    assert {"fedadam", "fedyogi", "fedavg", "fedavgm", "fedprox", "craft", "fedvg"} <= set(STRATEGIES)


def test_fedvg_composes_with_any_base_and_optimizer():
    """FedVG on top of FedAdam: FedVG's weighted direction, FedAdam's server step (by hand)."""
    torch.manual_seed(0)
    model = make_model("mlp", (1, 4, 4), 3, hidden=(5,))
    params = get_params(model)
    deltas = {k: 0.1 * torch.randn(3, *v.shape) for k, v in params.items()}
    val = (torch.rand(20, 1, 4, 4), torch.arange(20) % 3)
    s = FedVG.on_top_of(FedAdam(server_lr=0.05, tau=1e-2), val)
    assert isinstance(s.optimizer, ServerAdam) and s.server_lr == 0.05
    new, diag = Server(s, params).aggregate(_updates(deltas, [1, 2, 3], model))
    step = fedvg_aggregate(deltas, diag["weights"])
    for k in params:
        d = step[k]  # m_1 = (1-b1) d, v_1 = b2 tau^2 + (1-b2) d^2
        m1, v1 = 0.1 * d, 0.99 * 1e-4 + 0.01 * d**2
        torch.testing.assert_close(new[k], params[k] + 0.05 * m1 / (v1.sqrt() + 1e-2))
    # the base's (stateless) optimizer is used; FedProx's clients are kept
    base = FedProx(mu=0.2, optimizer=ServerMomentum(0.3, 0.5))
    vg = FedVG(val, base=base)
    assert vg.optimizer is base.optimizer and vg.server_momentum == 0.5 and vg.prox_mu == 0.2
    assert vg.configure_local(LocalTraining()).prox_mu == 0.2
    assert isinstance(FedVG(val, optimizer=ServerAdam()).optimizer, ServerOptimizer)


@pytest.mark.parametrize("cls", [ServerSGD, ServerMomentum, ServerAdam, ServerYogi, ServerAdagrad])
def test_a_step_whose_direction_or_state_does_not_match_the_parameters_names_it(cls):
    """A missing name was a bare ``KeyError: 'b'``; a shape of size 1 was broadcast silently."""
    params = {"w": torch.ones(2), "b": torch.ones(1)}
    opt = cls(0.5)
    state = opt.init_state(params)
    with pytest.raises(ValueError, match=r"direction must have the names of params \['b', 'w'\]; missing \['b'\]"):
        opt.step(params, {"w": torch.ones(2)}, state)
    with pytest.raises(ValueError, match=r"unexpected \['c'\]"):
        opt.step(params, {"w": torch.ones(2), "b": torch.ones(1), "c": torch.ones(1)}, state)
    with pytest.raises(ValueError, match=r"direction\['w'\] has shape \(1,\), params\['w'\] has \(2,\)"):
        opt.step(params, {"w": torch.ones(1), "b": torch.ones(1)}, state)
    if state:
        moment = next(iter(state))
        with pytest.raises(ValueError, match=rf"needs state\['{moment}'\]"):
            opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, {})
        partial = {**state, moment: {"w": state[moment]["w"]}}
        with pytest.raises(ValueError, match=rf"state\['{moment}'\] must have the names of params"):
            opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, partial)
    new, _ = opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, state)  # a matching step still runs
    assert new.keys() == params.keys() and torch.equal(params["w"], torch.ones(2))


@pytest.mark.parametrize("name", [None, 3, b"fedavg", ["fedavg"]])
def test_make_strategy_refuses_a_name_that_is_not_a_string(name):
    with pytest.raises(TypeError, match=r"name must be a strategy's short name \(a str, e.g. 'fedavg'\), got") as err:
        make_strategy(name)
    assert repr(name) in str(err.value) and "fedavg" in str(err.value)


@pytest.mark.parametrize("make", [ServerSGD, ServerMomentum, ServerAdam, ServerYogi, ServerAdagrad, sgd])
def test_an_optimizers_bad_lr_names_lr_not_server_lr(make):
    """Was: ``ServerAdam(lr=-1)`` said "server_lr must be > 0", an argument it does not have."""
    with pytest.raises(ValueError, match=r"^lr must be > 0, got -1\.$"):
        make(lr=-1)


VAL = (torch.rand(20, 1, 4, 4), torch.arange(20) % 3)


@pytest.mark.parametrize(
    "make",
    [
        FedAvg,
        FedProx,
        FedAvgM,
        FedAdam,
        FedYogi,
        FedAdagrad,
        lambda **kw: FedVG(VAL, **kw),
        lambda **kw: FedVG(VAL, server_momentum=0.5, **kw),
    ],
    ids=["FedAvg", "FedProx", "FedAvgM", "FedAdam", "FedYogi", "FedAdagrad", "FedVG", "FedVG+momentum"],
)
def test_a_strategys_bad_server_lr_still_names_server_lr(make):
    with pytest.raises(ValueError, match=r"^server_lr must be > 0, got -1\.$"):
        make(server_lr=-1)

"""Server optimizers (SGD, momentum, FedOpt's Adam/Yogi/Adagrad) against their update rules written out; server
steps as pure ``(init, update)`` transforms and their chains."""

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
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerSGD,
    ServerYogi,
    chain,
    clip_by_global_norm,
    make_strategy,
    momentum,
    scale,
    scale_by_adagrad,
    scale_by_adam,
    scale_by_yogi,
    sgd,
    simulate,
)
from fedlearn_edu.aggregators import fedvg_aggregate
from fedlearn_edu.engine import LocalTraining
from fedlearn_edu.models import make_model
from fedlearn_edu.params import get_params
from fedlearn_edu.strategies import STRATEGIES, ClientUpdates, ServerOptimizer
from tests.server_steps import Server
from tests.test_checkpoint import KW, _assert_same_history, _assert_same_tree, _model


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
    where, own = "state", state
    if isinstance(state, tuple):  # ServerMomentum: its chain's state, one per piece (the velocity first)
        with pytest.raises(ValueError, match=r"state must be the chain's state, a tuple of its 2 pieces' states"):
            opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, {})
        where, own = r"state\[0\]", state[0]
    if own:
        moment = next(iter(own))
        bad = {} if where == "state" else ({}, {})
        with pytest.raises(ValueError, match=rf"needs {where}\['{moment}'\]"):
            opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, bad)
        partial = {**own, moment: {"w": own[moment]["w"]}}
        partial = partial if where == "state" else (partial, {})
        with pytest.raises(ValueError, match=rf"{where}\['{moment}'\] must have the names of params"):
            opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, partial)
    new, _ = opt.step(params, {"w": torch.ones(2), "b": torch.ones(1)}, state)  # a matching step still runs
    assert new.keys() == params.keys() and torch.equal(params["w"], torch.ones(2))


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


# Server steps as pure ``(init, update)`` transforms and their chains: the math, the named optimizers
# as chains (bitwise today's update rules), and the one-line clipped FedAvg through simulate and checkpoints.


def _tree(seed, dtype=torch.float64, stacked=False, scale_=1.0):
    """A two-tensor model's parameters (or K = 3 stacked ones), random."""
    g = torch.Generator().manual_seed(seed)
    lead = (3,) if stacked else ()
    return {
        "w": scale_ * torch.randn(*lead, 4, 5, generator=g, dtype=dtype),
        "b": scale_ * torch.randn(*lead, 5, generator=g, dtype=dtype),
    }


# ---------------------------------------------------------------------------------------------
# Today's optimizers, frozen: the formulas as they were written before they became chains.
# ---------------------------------------------------------------------------------------------


def _frozen_step(kind, hp, params, g, state):
    """One step of ServerSGD/Momentum/Adam/Yogi/Adagrad as written before the transforms (frozen copy)."""
    lr = hp["lr"]
    if kind == "sgd":
        return {k: v - lr * g[k] for k, v in params.items()}, state
    if kind == "momentum":
        velocity = {k: hp["momentum"] * state["velocity"][k] + d for k, d in g.items()}
        return {k: v - lr * velocity[k] for k, v in params.items()}, {"velocity": velocity}
    b1, b2, tau = hp["beta1"], hp["beta2"], hp["tau"]
    second = {
        "adam": lambda v, g2: b2 * v + (1 - b2) * g2,
        "yogi": lambda v, g2: v - (1 - b2) * g2 * torch.sign(v - g2),
        "adagrad": lambda v, g2: v + g2,
    }[kind]
    m = {k: b1 * state["m"][k] + (1 - b1) * d for k, d in g.items()}
    v = {k: second(state["v"][k], d * d) for k, d in g.items()}
    return {k: p - lr * m[k] / (v[k].sqrt() + tau) for k, p in params.items()}, {"m": m, "v": v}


def _canonical(kind, hp):
    """The canonical transform an alias names (one name per optimizer)."""
    if kind == "sgd":
        return sgd(hp["lr"])
    if kind == "momentum":
        return chain(momentum(hp["momentum"]), sgd(hp["lr"]))
    scaler = {"adam": scale_by_adam, "yogi": scale_by_yogi, "adagrad": scale_by_adagrad}[kind]
    return scaler(hp["beta1"], hp["beta2"], hp["tau"], lr=hp["lr"])


def _flat(state):
    """An alias's state in the frozen layout: ServerMomentum's chain state is (momentum's, sgd's {})."""
    if isinstance(state, tuple):
        assert len(state) == 2 and state[1] == {}
        return state[0]
    return state


NAMED = [
    (ServerSGD, "sgd", dict(lr=0.3)),
    (ServerMomentum, "momentum", dict(lr=0.7, momentum=0.6)),
    (ServerAdam, "adam", dict(lr=0.037, beta1=0.8, beta2=0.95, tau=1e-2)),
    (ServerYogi, "yogi", dict(lr=0.037, beta1=0.9, beta2=0.99, tau=1e-3)),
    (ServerAdagrad, "adagrad", dict(lr=0.11, beta1=0.9, beta2=0.99, tau=3e-3)),
]


@pytest.mark.parametrize("stacked", [False, True], ids=["one model", "stacked K"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls, kind, hp", NAMED, ids=[c.__name__ for c, _, _ in NAMED])
def test_named_optimizers_are_aliases_bitwise_equal_to_todays_formulas(cls, kind, hp, dtype, stacked):
    """Six steps with directions from 1e-3 to 1e2: parameters and every state tensor bit for bit."""
    opt = cls(**hp)
    canonical = _canonical(kind, hp)
    assert opt.lr == hp["lr"] == canonical.lr
    # a thin alias: a subclass of the canonical transform (ServerMomentum: a name for its chain)
    assert isinstance(opt, type(canonical)) if kind != "momentum" else repr(opt.as_chain()) == repr(canonical)
    params = _tree(0, dtype, stacked)
    state = opt.init_state(params)
    frozen_params = dict(params)
    frozen_state = {m: {k: t.clone() for k, t in s.items()} for m, s in _flat(state).items()}
    for t in range(6):
        g = _tree(t + 1, dtype, stacked, scale_=10.0 ** (t - 3))
        params, state = opt.step(params, g, state)
        frozen_params, frozen_state = _frozen_step(kind, hp, frozen_params, g, frozen_state)
        for k in params:
            assert params[k].dtype == dtype and torch.equal(params[k], frozen_params[k]), (t, k)
        flat = _flat(state)
        assert flat.keys() == frozen_state.keys()  # {}, {"velocity"} or {"m", "v"}
        for m in flat:
            for k in flat[m]:
                assert torch.equal(flat[m][k], frozen_state[m][k]), (t, m, k)
    # the alias and its canonical transform are the same step, on the same state layout
    a, sa = opt.step(params, g, state)
    b, sb = canonical.step(params, g, state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = _flat(sa), _flat(sb)
    assert all(torch.equal(sa[m][k], sb[m][k]) for m in sa for k in sa[m])


def test_named_optimizers_keep_their_repr_and_chains_read_as_formulas():
    assert repr(ServerSGD(0.5)) == "ServerSGD(lr=0.5)"
    assert repr(ServerMomentum(0.7, 0.6)) == "ServerMomentum(momentum=0.6, lr=0.7)"
    assert repr(ServerAdam()) == "ServerAdam(beta1=0.9, beta2=0.99, tau=0.001, lr=0.01)"
    assert repr(ServerMomentum(0.7, 0.6).as_chain()) == "chain(momentum(beta=0.6), sgd(lr=0.7))"
    assert repr(ServerYogi(0.1)) == "ServerYogi(beta1=0.9, beta2=0.99, tau=0.001, lr=0.1)"
    clipped = FedAvg(optimizer=chain(clip_by_global_norm(2.0), sgd(0.5)))
    assert repr(clipped) == "FedAvg(optimizer=chain(clip_by_global_norm(max_norm=2.0), sgd(lr=0.5)))"
    # the step size Strategy.server_lr reports: the product of the pieces' (scale(f) steps by -f)
    assert clipped.server_lr == 0.5 and chain(clip_by_global_norm(1.0), scale(-0.25)).lr == 0.25
    assert chain(momentum(0.9), ServerAdam(0.1)).lr == 0.1 and chain(clip_by_global_norm(1.0)).lr is None


def test_the_momentum_chain_and_the_fedopt_chain_of_pieces_equal_the_named_ones():
    """``chain(momentum(b), sgd(eta))`` is ServerMomentum bitwise; ``chain(scale_by_adam(), sgd(eta))``
    is FedAdam's step up to the rounding of ``eta (m / s)`` against ``(eta m) / s``."""
    params = _tree(0)
    for pieces, named in [
        (chain(momentum(0.6), sgd(0.7)), ServerMomentum(0.7, 0.6)),
        (chain(scale_by_adam(0.8, 0.95, 1e-2), sgd(0.05)), ServerAdam(0.05, 0.8, 0.95, 1e-2)),
        (chain(scale_by_yogi(), sgd(0.05)), ServerYogi(0.05)),
        (chain(scale_by_adagrad(), sgd(0.05)), ServerAdagrad(0.05)),
    ]:
        pa, sa, pb, sb = params, pieces.init_state(params), params, named.init_state(params)
        for t in range(4):
            g = _tree(t + 1)
            (pa, sa), (pb, sb) = pieces.step(pa, g, sa), named.step(pb, g, sb)
        for k in pa:
            torch.testing.assert_close(pa[k], pb[k], rtol=1e-14, atol=0)
        if isinstance(named, ServerMomentum):
            assert all(torch.equal(pa[k], pb[k]) for k in pa)


def _norm(tree):
    return float(np.sqrt(sum((v.numpy() ** 2).sum() for v in tree.values())))


@pytest.mark.parametrize("stacked", [False, True])
def test_clip_by_global_norm_is_min_of_norm_and_c_along_the_same_direction(stacked):
    """Against NumPy: one L2 norm over every tensor, ``g min(1, C / ||g||)``."""
    g = _tree(3, stacked=stacked)
    norm = _norm(g)
    for c in (0.25 * norm, 0.999 * norm, norm, 4 * norm):
        out, state = clip_by_global_norm(c).update(g, {}, {})
        assert state == {}
        assert _norm(out) == pytest.approx(min(norm, c), rel=1e-12)
        factor = min(1.0, c / norm)
        for k in g:
            np.testing.assert_allclose(out[k].numpy(), g[k].numpy() * factor, rtol=1e-13)
            if c >= norm:
                assert torch.equal(out[k], g[k])  # not clipped: passed through bit for bit
    zero = {k: torch.zeros_like(v) for k, v in g.items()}
    out, _ = clip_by_global_norm(1.0).update(zero, {}, {})
    assert all(torch.equal(out[k], zero[k]) for k in g)  # zero stays zero, no 0/0
    assert clip_by_global_norm(1.0).update({}, {}, {}) == ({}, {})


def test_chain_order_matters_clip_then_scale_differs_from_scale_then_clip():
    """||g|| = 0.5 < C = 1: clipping first leaves g, then x3 gives norm 1.5; x3 first gives norm 1.5,
    which clipping brings to 1."""
    g = {"w": torch.tensor([0.3, 0.4], dtype=torch.float64)}
    a, _ = chain(clip_by_global_norm(1.0), scale(3.0)).update(g, ({}, {}), {})
    b, _ = chain(scale(3.0), clip_by_global_norm(1.0)).update(g, ({}, {}), {})
    assert _norm(a) == pytest.approx(1.5) and _norm(b) == pytest.approx(1.0)
    # the clipped FedAvg step is bounded by eta C when clipping comes first, by C when it comes last
    big = {"w": torch.tensor([30.0, 40.0], dtype=torch.float64)}
    theta = {"w": torch.zeros(2, dtype=torch.float64)}
    first, _ = chain(clip_by_global_norm(1.0), sgd(0.5)).step(theta, big, ({}, {}))
    last, _ = chain(sgd(0.5), clip_by_global_norm(1.0)).step(theta, big, ({}, {}))
    assert _norm(first) == pytest.approx(0.5) and _norm(last) == pytest.approx(1.0)
    torch.testing.assert_close(first["w"], torch.tensor([-0.3, -0.4], dtype=torch.float64))


def test_momentum_with_beta_zero_is_the_identity():
    m = momentum(0.0)
    state = m.init(_tree(0))
    for t in range(4):
        g = _tree(t + 1)
        u, state = m.update(g, state, {})
        assert all(torch.equal(u[k], g[k]) for k in g)
    m = momentum(0.5)  # and with beta > 0: v_1 = g, v_2 = beta v_1 + g
    g1, g2 = _tree(1), _tree(2)
    u1, state = m.update(g1, m.init(g1), {})
    u2, _ = m.update(g2, state, {})
    assert all(torch.equal(u1[k], g1[k]) and torch.equal(u2[k], 0.5 * g1[k] + g2[k]) for k in g1)


def test_sgd_on_a_quadratic_has_its_minimiser_as_fixed_point():
    """f(theta) = 1/2 (theta - theta*)^T A (theta - theta*): the minimiser is a fixed point bit for bit,
    and sgd(eta) with eta < 2 / lambda_max converges to it from elsewhere."""
    a = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    star = torch.tensor([1.0, -2.0], dtype=torch.float64)
    grad = lambda theta: {"w": a @ (theta["w"] - star)}  # noqa: E731
    opt = chain(sgd(0.4))
    fixed, _ = opt.step({"w": star.clone()}, grad({"w": star}), ({},))
    assert torch.equal(fixed["w"], star)
    theta = {"w": torch.zeros(2, dtype=torch.float64)}
    for _ in range(200):
        theta, _ = opt.step(theta, grad(theta), ({},))
    torch.testing.assert_close(theta["w"], star, rtol=0, atol=1e-12)


def test_transforms_are_pure_and_a_nested_named_optimizer_chains():
    """The same inputs give the same outputs twice; inputs are not modified; ServerAdam inside a
    chain keeps its own state entries ({"m", "v"})."""
    params, g = _tree(0), _tree(1)
    opt = chain(clip_by_global_norm(0.5), ServerAdam(0.1))
    state = opt.init_state(params)
    assert state[0] == {} and set(state[1]) == {"m", "v"}
    saved = {m: {k: v.clone() for k, v in s.items()} for m, s in state[1].items()}
    given = {k: v.clone() for k, v in g.items()}
    (pa, sa), (pb, sb) = opt.step(params, g, state), opt.step(params, g, state)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert all(torch.equal(sa[1][m][k], sb[1][m][k]) for m in sa[1] for k in sa[1][m])
    assert all(torch.equal(state[1][m][k], saved[m][k]) for m in saved for k in saved[m])
    assert all(torch.equal(g[k], given[k]) for k in g)
    # = clipping the direction by hand, then FedAdam's step
    clipped, _ = clip_by_global_norm(0.5).update(g, {}, params)
    want, _ = ServerAdam(0.1).step(params, clipped, ServerAdam(0.1).init_state(params))
    assert all(torch.equal(pa[k], want[k]) for k in pa)


def test_a_users_own_transform_chains_and_is_checked_like_the_others():
    class Negate(ServerOptimizer):
        def update(self, direction, state, params):
            return {k: -v for k, v in direction.items()}, state

    opt = chain(Negate(), scale(0.5))
    new, _ = opt.step({"w": torch.ones(2)}, {"w": torch.tensor([2.0, -2.0])}, ({}, {}))
    assert torch.equal(new["w"], torch.tensor([0.0, 2.0]))
    with pytest.raises(ValueError, match=r"chain\.step: direction must have the names of params"):
        opt.step({"w": torch.ones(2)}, {"v": torch.ones(2)}, ({}, {}))
    with pytest.raises(NotImplementedError, match="must define update"):
        chain(ServerOptimizer()).step({"w": torch.ones(1)}, {"w": torch.ones(1)}, ({},))


def test_bad_transforms_and_hyper_parameters_are_refused_by_name():
    with pytest.raises(TypeError, match=r"chain's transform 1 must be a server transform .* got 'sgd' \(str\)"):
        chain(clip_by_global_norm(1.0), "sgd")
    with pytest.raises(TypeError, match=r"chain's transform 0 must be a server transform .*\(type\)"):
        chain(sgd)  # the class, not sgd(1.0)
    for c in (0, -1.0):
        with pytest.raises(ValueError, match=rf"^max_norm must be > 0, got {c}"):
            clip_by_global_norm(c)
    with pytest.raises(ValueError, match=r"^max_norm must be finite"):
        clip_by_global_norm(float("inf"))
    for beta in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=rf"^beta must be in \[0, 1\), got {beta}"):
            momentum(beta)
    with pytest.raises(ValueError, match=r"^beta1 must be in \[0, 1\)"):
        scale_by_adam(beta1=1.0)
    with pytest.raises(ValueError, match=r"^beta2 must be in \[0, 1\)"):
        scale_by_yogi(beta2=-0.5)
    with pytest.raises(ValueError, match=r"^tau must be > 0"):
        scale_by_adagrad(tau=0)
    with pytest.raises(TypeError, match=r"^factor must be a real number, got '2'"):
        scale("2")
    with pytest.raises(ValueError, match=r"chain\.update: state must be the chain's state, a tuple of its 1 pieces'"):
        chain(momentum(0.5)).update({"w": torch.ones(1)}, {}, {})  # a dict of entries: the layout before per-piece
    with pytest.raises(TypeError, match=r"ServerOptimizer .*chain\(clip_by_global_norm"):
        FedAvg(optimizer=clip_by_global_norm)


@pytest.fixture(scope="module")
def fed():
    from fedlearn_edu import shifted_federation

    return shifted_federation("digits", "label", 2, 3, samples_per_client=24, seed=0)


def test_the_one_line_clipped_fedavg_clips_in_simulate_and_its_norm_is_part_of_the_checkpoint(fed, tmp_path):
    """The clipping acts in tests/test_checkpoint.py's setting (where the one-liner is killed and resumed
    bit-identically): plain FedAvg ends elsewhere; a checkpoint of another C is not resumed."""
    clipped = lambda c: FedAvg(optimizer=chain(clip_by_global_norm(c), sgd(1.0)))  # noqa: E731
    path = tmp_path / "run.pt"
    full = simulate(fed, _model(fed), clipped(0.05), checkpoint=path, **KW)
    plain = simulate(fed, _model(fed), FedAvg(), **KW)
    assert not torch.equal(full.final_params["out.weight"], plain.final_params["out.weight"])
    with pytest.raises(ValueError, match="its strategy is"):
        simulate(fed, _model(fed), clipped(0.1), checkpoint=path, resume=True, **KW)


def test_a_chain_with_state_resumes_bit_identically(fed, tmp_path):
    """Clipped FedAdam (a chain whose state holds moments): a shorter run continued to more rounds."""
    make = lambda: FedAvg(optimizer=chain(clip_by_global_norm(0.05), scale_by_adam(lr=0.01)))  # noqa: E731
    full = simulate(fed, _model(fed), make(), **KW)
    path = tmp_path / "run.pt"
    simulate(fed, _model(fed), make(), checkpoint=path, checkpoint_every=2, **dict(KW, rounds=3))
    resumed = simulate(fed, _model(fed), make(), checkpoint=path, resume=True, **KW)
    _assert_same_history(full, resumed)
    _assert_same_tree(full.final_server_state, resumed.final_server_state)
    clip_state, adam_state = full.final_server_state["optimizer"]  # one state per piece
    assert clip_state == {} and set(adam_state) == {"m", "v"}


def test_a_chains_step_size_is_the_size_of_its_step_against_the_direction():
    """``lr`` is what the chain steps along ``-g``, signs included: the sign flips of two scalers cancel."""
    params, g = {"w": torch.tensor([1.0, -2.0])}, {"w": torch.tensor([0.5, 4.0])}
    for opt, lr in [
        (chain(sgd(0.5)), 0.5),
        (chain(scale(2.0), sgd(0.5)), 1.0),
        (chain(clip_by_global_norm(100.0), scale(-0.25)), 0.25),
        (chain(scale(0.5)), -0.5),
    ]:
        assert opt.lr == lr
        stepped, _ = opt.step(params, g, opt.init_state(params))
        assert torch.allclose(stepped["w"], params["w"] - lr * g["w"])


@pytest.mark.parametrize("opt", [chain(clip_by_global_norm(1.0)), chain(scale(0.5)), clip_by_global_norm(1.0)])
def test_a_strategy_refuses_an_optimizer_that_does_not_step_downhill(opt):
    """A chain without a step (or one that steps along +g) would climb the loss: FedAvg refuses it by name."""
    with pytest.raises(ValueError, match=r"End a chain with sgd\(lr\)"):
        FedAvg(optimizer=opt)


def test_pieces_flatten_chains_and_named_optimizers_and_fedvg_reads_its_momentum_from_them():
    """FedVG's ``server_momentum`` is the beta of a momentum piece, wherever the chain holds it."""
    from fedlearn_edu import FedVG

    assert [type(p).__name__ for p in ServerMomentum(1.0, 0.9).pieces()] == ["momentum", "sgd"]
    nested = chain(clip_by_global_norm(1.0), chain(momentum(0.7), sgd(0.5)))
    assert [type(p).__name__ for p in nested.pieces()] == ["clip_by_global_norm", "momentum", "sgd"]
    val = (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    assert FedVG(val, base=FedAvg(optimizer=nested)).server_momentum == 0.7
    assert FedVG(val, base=FedAvg(optimizer=ServerMomentum(1.0, 0.8))).server_momentum == 0.8
    assert FedVG(val, base=FedAvg(optimizer=chain(sgd(1.0)))).server_momentum == 0.0


def test_a_chain_keeps_one_state_per_piece_so_two_momenta_compose():
    """Was: ValueError "both keep the state entry 'velocity'" (one merged dict). Now Optax's layout,
    checked against NumPy: v1 <- 0.9 v1 + g, v2 <- 0.5 v2 + v1, theta <- theta - 1.0 v2."""
    opt = chain(momentum(0.9), momentum(0.5), sgd(1.0))
    params = _tree(0)
    state = opt.init_state(params)
    assert len(state) == 3 and set(state[0]) == set(state[1]) == {"velocity"} and state[2] == {}
    theta = {k: v.numpy().copy() for k, v in params.items()}
    v1 = {k: np.zeros_like(v) for k, v in theta.items()}
    v2 = {k: np.zeros_like(v) for k, v in theta.items()}
    for t in range(5):
        g = _tree(t + 1)
        params, state = opt.step(params, g, state)
        for k in theta:
            v1[k] = 0.9 * v1[k] + g[k].numpy()
            v2[k] = 0.5 * v2[k] + v1[k]
            theta[k] = theta[k] - 1.0 * v2[k]
            np.testing.assert_allclose(params[k].numpy(), theta[k], rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(state[0]["velocity"][k].numpy(), v1[k], rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(state[1]["velocity"][k].numpy(), v2[k], rtol=1e-13, atol=1e-13)
    # two FedOpt scalers compose too, each with its own moments
    two = chain(scale_by_adam(), scale_by_yogi(), sgd(0.1))
    state = two.init_state(params)
    assert set(state[0]) == set(state[1]) == {"m", "v"}
    stepped, _ = two.step(params, _tree(9), state)
    assert all(torch.isfinite(stepped[k]).all() for k in stepped)


def test_each_optimizer_has_one_canonical_name_and_the_others_are_aliases():
    """ServerSGD/ServerAdam/ServerYogi/ServerAdagrad are subclasses of sgd and the FedOpt scalers that
    only put the step first; FedAdam (the strategy) is FedAvg's direction under that same step."""
    for alias, canonical in [
        (ServerSGD(0.3), sgd(0.3)),
        (ServerAdam(0.05, 0.8, 0.95, 1e-2), scale_by_adam(0.8, 0.95, 1e-2, lr=0.05)),
        (ServerYogi(0.05), scale_by_yogi(lr=0.05)),
        (ServerAdagrad(0.05), scale_by_adagrad(lr=0.05)),
    ]:
        assert isinstance(alias, type(canonical)) and vars(alias) == vars(canonical)
        assert type(alias).update is type(canonical).update
    assert FedAdam(server_lr=0.05).optimizer.lr == 0.05 and isinstance(FedAdam().optimizer, scale_by_adam)
    assert isinstance(FedYogi().optimizer, scale_by_yogi) and isinstance(FedAdagrad().optimizer, scale_by_adagrad)
    with pytest.raises(TypeError, match=r"^lr must be a real number"):
        ServerAdam(lr=None)  # the alias always steps (the scaler alone may leave the step to a chain)


def test_fedadam_is_fedavg_under_scale_by_adam_bit_for_bit(fed):
    """The strategy alias: FedAdam(server_lr, b1, b2, tau) runs as FedAvg(optimizer=scale_by_adam(..., lr=...))."""
    kw = dict(rounds=3, clients_per_round=3, local_epochs=1, batch_size=16, lr=0.05, seed=4, progress=False)
    a = simulate(fed, _model(fed), FedAdam(server_lr=0.03, beta1=0.8, tau=1e-2), **kw)
    b = simulate(fed, _model(fed), FedAvg(optimizer=scale_by_adam(0.8, 0.99, 1e-2, lr=0.03)), **kw)
    _assert_same_tree(a.final_params, b.final_params)
    _assert_same_tree(a.final_server_state["optimizer"], b.final_server_state["optimizer"])


def test_a_checkpoint_of_another_optimizer_layout_is_refused_by_name(fed, tmp_path):
    """A FedAvgM checkpoint whose optimizer state is the old merged dict does not fit the chain's tuple."""
    from fedlearn_edu.checkpoint import check_states

    model = _model(fed)
    params = get_params(model)
    server, clients = FedAvgM().init_state(params, model, len(fed), 0)
    old = {"server_state": {**dict(server), "optimizer": dict(server["optimizer"][0])}, "client_state": clients}
    with pytest.raises(ValueError, match=r"server_state\['optimizer'\] is a dict, not a sequence of 2"):
        check_states(tmp_path / "old.pt", old, server, clients, params)
    check_states(tmp_path / "new.pt", {"server_state": dict(server), "client_state": clients}, server, clients, params)

"""DP-FedAvg (:mod:`fedlearn_edu.strategies.dp`): adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy,
NeurIPS 2021); the clip, fixed denominator and seeded Gaussian noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlearn_edu import DPFedAvg, FedVG, federated_dataset, make_model, simulate
from fedlearn_edu.aggregators import norm_clip
from fedlearn_edu.strategies import ClientUpdates
from fedlearn_edu.strategies.dp import split_noise_multiplier
from fedlearn_edu.utils import derive_seed

KW = dict(rounds=3, clients_per_round=5, lr=0.1, batch_size=16, progress=False, seed=2, device="cpu")


def _updates(norms, t=1, d=7, seed=0):
    """Updates whose whole norms are exactly ``norms`` (random directions)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(norms), d, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True) * torch.tensor(norms, dtype=torch.float64)[:, None]
    deltas = {"w": x[:, :4].reshape(-1, 2, 2).clone(), "b": x[:, 4:].clone()}
    m = len(norms)
    return ClientUpdates(t, torch.arange(m), deltas, torch.ones(m), torch.zeros(m), None)


def _params(u):
    return {k: torch.zeros(v.shape[1:], dtype=v.dtype) for k, v in u.deltas.items()}


def test_the_split_noise_multiplier_is_the_papers_formula():
    for z, sigma_b in [(1.0, 5.0), (0.8, 0.5), (2.0, 1.01), (1.1, 100.0)]:
        z_delta = split_noise_multiplier(z, sigma_b)
        assert z_delta == pytest.approx((z**-2 - (2 * sigma_b) ** -2) ** -0.5, rel=1e-12)
        # the defining property: the pair composes to one Gaussian mechanism with multiplier z
        assert (z_delta**-2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(z, rel=1e-12)
        assert z_delta > z
    assert split_noise_multiplier(0.0, 0.0) == 0.0
    for sigma_b in (0.5, 0.3, 0.0):  # 2 sigma_b <= z: z_Delta undefined
        with pytest.raises(ValueError, match=r"count_noise must be > noise_multiplier / 2 = 0\.5"):
            split_noise_multiplier(1.0, sigma_b)
    with pytest.raises(ValueError, match=r"count_noise must be > noise_multiplier / 2"):
        DPFedAvg(noise_multiplier=1.0, target_quantile=0.5, count_noise=0.4)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"target_quantile must be in \[0, 1\], got 1\.5"):
        DPFedAvg(target_quantile=1.5, noise_multiplier=0.0)
    with pytest.raises(ValueError, match="clip_lr must be > 0, got 0"):
        DPFedAvg(target_quantile=0.5, clip_lr=0, noise_multiplier=0.0)
    with pytest.raises(ValueError, match="count_noise must be >= 0, got -1.0"):
        DPFedAvg(target_quantile=0.5, count_noise=-1.0, noise_multiplier=0.0)
    with pytest.raises(ValueError, match=r"count_noise must be given with target_quantile=0.5 \(adaptive clipping\)"):
        DPFedAvg(target_quantile=0.5, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="count_noise is for adaptive clipping; give target_quantile"):
        DPFedAvg(count_noise=1.0)
    with pytest.raises(TypeError, match="target_quantile must be a real number, got '0.5'"):
        DPFedAvg(target_quantile="0.5", noise_multiplier=0.0)
    assert not DPFedAvg().adaptive and DPFedAvg().target_quantile is None
    assert repr(DPFedAvg()) == "DPFedAvg(optimizer=ServerSGD(lr=1.0), clip=1.0, noise_multiplier=1.0, denominator=None)"


def test_one_round_is_the_numpy_transcription():
    """Clip at C_t, noise the sum with z_Delta C_t, and C_{t+1} = C_t exp(-eta (b_bar - gamma))."""
    norms = [0.3, 0.9, 1.4, 2.5, 0.05, 1.1]
    u = _updates(norms, t=3)
    z, sigma_b, gamma, eta, c0, d = 1.2, 2.0, 0.4, 0.3, 1.0, 10
    s = DPFedAvg(clip=c0, noise_multiplier=z, denominator=d, target_quantile=gamma, clip_lr=eta, count_noise=sigma_b)
    state = s.init_state(_params(u), None, 20, 11)[0]
    assert state["clip"] == c0
    before = {k: v.clone() for k, v in u.deltas.items()}
    new, diag = s.aggregate(state, u)
    assert state["clip"] == c0 and all(torch.equal(u.deltas[k], before[k]) for k in before)  # nothing modified
    # NumPy: the count's noise is N(0, sigma_b^2) from its own seeded stream
    g = torch.Generator().manual_seed(derive_seed(11, 3, 0xC0B7))
    count_noise = sigma_b * float(torch.randn((), generator=g, dtype=torch.float64))
    b = np.array(norms) <= c0
    b_bar = (b.sum() + count_noise) / d
    assert diag["unclipped"] == pytest.approx(b_bar, rel=1e-12)
    assert new["clip"] == pytest.approx(c0 * np.exp(-eta * (b_bar - gamma)), rel=1e-12)
    z_delta = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    assert diag["noise_std"] == pytest.approx(z_delta * c0 / d) and diag["clip"] == c0
    x = np.concatenate([u.deltas["w"].reshape(6, -1).numpy(), u.deltas["b"].numpy()], axis=1)
    clipped = x * np.minimum(1, c0 / np.linalg.norm(x, axis=1))[:, None]
    noise = s.noise(_params(u), 11, 3, clip=c0)
    flat_noise = np.concatenate([noise["w"].reshape(-1).numpy(), noise["b"].numpy()])
    ref = -(-(clipped.sum(0) + flat_noise) / d)  # theta_0 = 0, server_lr 1: theta_1 = -g
    got = np.concatenate([new["params"]["w"].reshape(-1).numpy(), new["params"]["b"].numpy()])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    big = s.noise({"v": torch.zeros(100, 100, dtype=torch.float64)}, 11, 3, clip=c0)["v"]
    assert abs(float(big.std()) - z_delta * c0) < 0.03 * z_delta * c0  # the update noise uses z_Delta


def test_the_clip_settles_at_the_target_quantile_without_noise():
    """sigma_b = 0, fixed norms: every C with a fraction gamma of the norms <= C is a fixed point."""
    norms = [0.2, 0.5, 0.7, 1.3, 2.0, 4.0, 6.5, 9.0]
    u = _updates(norms)
    for gamma, lo, hi in [(0.5, 1.3, 2.0), (0.25, 0.5, 0.7), (0.75, 4.0, 6.5)]:
        for c0 in (0.01, 50.0):
            s = DPFedAvg(clip=c0, noise_multiplier=0.0, target_quantile=gamma, clip_lr=0.5)
            state = s.init_state(_params(u), None, 8, 0)[0]
            path = []
            for _ in range(200):
                state, _ = s.aggregate({**state, "params": _params(u)}, u)
                path.append(state["clip"])
            assert lo <= path[-1] < hi, (gamma, c0, path[-1])  # the gamma-quantile of the norms
            assert path[-1] == path[-2] == path[-50]  # a fixed point: exp(0) = 1
            assert np.quantile(norms, gamma, method="inverted_cdf") == lo
    # a gamma between two grid points: C oscillates within one step's factor of the quantile
    s = DPFedAvg(clip=1.0, noise_multiplier=0.0, target_quantile=0.55, clip_lr=0.1)
    state = s.init_state(_params(u), None, 8, 0)[0]
    tail = []
    for i in range(400):
        state, _ = s.aggregate({**state, "params": _params(u)}, u)
        if i >= 300:
            tail.append(state["clip"])
    step = math.exp(0.1 * 0.55)
    assert 2.0 / step <= min(tail) and max(tail) <= 2.0 * step and min(tail) < 2.0 <= max(tail)


def _run(fed, strategy, **kw):
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    return simulate(fed, model, strategy, **{**KW, **kw})


def _adaptive():
    return DPFedAvg(clip=0.05, noise_multiplier=0.7, target_quantile=0.5, clip_lr=0.5, count_noise=1.0)


def test_adaptive_runs_agree_across_engines_and_resume_bitwise(tmp_path):
    fed = federated_dataset("digits", num_clients=8, alpha=0.5, seed=0)
    a = _run(fed, _adaptive(), engine="loop")
    b = _run(fed, _adaptive(), engine="vmap")
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    clips = [d["clip"] for d in a.diagnostics]
    assert clips[0] == 0.05 and len(set(clips)) == 3  # the norm moved every round
    assert [d["clip"] for d in b.diagnostics] == pytest.approx(clips, rel=1e-6)
    assert a.final_server_state["clip"] != 0.05
    path = tmp_path / "run.pt"
    _run(fed, _adaptive(), engine="loop", rounds=2, checkpoint=path)
    resumed = _run(fed, _adaptive(), engine="loop", checkpoint=path, resume=True)
    assert all(torch.equal(a.final_params[k], resumed.final_params[k]) for k in a.final_params)
    assert resumed.final_server_state["clip"] == a.final_server_state["clip"]
    fixed = _run(fed, DPFedAvg(clip=0.05, noise_multiplier=0.7), engine="loop")
    assert any(not torch.equal(a.final_params[k], fixed.final_params[k]) for k in a.final_params)


def test_the_run_is_accounted_with_the_total_multiplier():
    pytest.importorskip("dp_accounting")
    from fedlearn_edu.privacy import epsilon

    s = _adaptive()
    assert s.update_noise_multiplier == pytest.approx((0.7**-2 - 2.0**-2) ** -0.5)
    assert s.epsilon(10, 0.25, 1e-5) == epsilon(10, 0.25, 0.7, 1e-5)
    assert s.epsilon(10, 0.25, 1e-5) > epsilon(10, 0.25, s.update_noise_multiplier, 1e-5)


def test_clip_lr_without_target_quantile_is_refused_like_count_noise():
    for clip_lr in (0.5, -5, 0.2):  # was: accepted and ignored (even -5)
        with pytest.raises(
            ValueError, match=rf"^clip_lr is for adaptive clipping; give target_quantile too \(got {clip_lr}\)"
        ):
            DPFedAvg(clip_lr=clip_lr)
    assert DPFedAvg(target_quantile=0.5, noise_multiplier=0.0).clip_lr == 0.2  # the default, adaptive
    assert DPFedAvg(target_quantile=0.5, noise_multiplier=0.0, clip_lr=0.3).clip_lr == 0.3
    assert DPFedAvg().clip_lr is None


def test_extreme_noise_settings_name_the_argument():
    # was: OverflowError (34, 'Numerical result out of range') from z^-2
    z_delta = split_noise_multiplier(1e-200, 1.0)
    assert z_delta == pytest.approx(1e-200, rel=1e-12)
    assert DPFedAvg(noise_multiplier=1e-200, target_quantile=0.5, count_noise=1.0).update_noise_multiplier == z_delta
    # was: ZeroDivisionError (0.0 cannot be raised to a negative power)
    assert split_noise_multiplier(1e300, 1e308) == pytest.approx(1e300, rel=1e-12)
    assert split_noise_multiplier(1.0, 5.0) == (1.0 - 1 / 100) ** -0.5  # the formula as before, bit for bit
    assert split_noise_multiplier(1e308, 1e308) == pytest.approx(1e308 / 0.75**0.5, rel=1e-12)  # 2 sigma_b = inf
    with pytest.raises(ValueError, match=r"^count_noise=1e\+308 with noise_multiplier=1\.5e\+308 .* overflows"):
        split_noise_multiplier(1.5e308, 1e308)
    with pytest.raises(ValueError, match=r"^noise_multiplier \* clip, the noise's standard deviation, overflows"):
        DPFedAvg(clip=1e200, noise_multiplier=1e200)
    with pytest.raises(ValueError, match=r"z_Delta = .* times clip=1e\+300 overflows: lower noise_multiplier"):
        DPFedAvg(clip=1e300, noise_multiplier=1e8, target_quantile=0.5, count_noise=5e7 + 1)


def test_an_overflowing_clipping_norm_blames_clip_lr_or_count_noise():
    u = _updates([1.0, 2.0, 3.0, 4.0])
    # b_bar = 1 (every norm under C = 10): C exp(-1e308 (1 - 0.5)) was 0, then "clip must be > 0, got 0.0"
    dp = DPFedAvg(clip=10.0, noise_multiplier=0.0, target_quantile=0.5, clip_lr=1e308)
    with pytest.raises(
        FloatingPointError, match=r"^Round 1: adaptive clipping's norm .* underflows to 0: lower clip_lr \(now 1e\+308"
    ):
        dp.aggregate(dp.init_state(_params(u), None, 4, 0)[0], u)
    # a huge count noise: b_bar far below gamma, exp overflowed ("math range error")
    dp = DPFedAvg(clip=10.0, noise_multiplier=1.0, target_quantile=0.5, count_noise=1e300)
    state = dp.init_state(_params(u), None, 4, 0)[0]
    with pytest.raises(
        FloatingPointError,
        match=r"^Round 1: .* (over|under)flows.*: lower clip_lr \(now 0\.2; .*or count_noise \(now 1e\+300",
    ):
        dp.aggregate(state, u)


PRIVATE_KW = dict(rounds=2, clients_per_round=5, lr=0.1, batch_size=16, progress=False, seed=2, device="cpu")


def _fc_updates(m=6, seed=0, t=1):
    g = torch.Generator().manual_seed(seed)
    deltas = {"fc.weight": 3 * torch.randn(m, 4, 3, generator=g), "fc.bias": torch.randn(m, 4, generator=g)}
    return ClientUpdates(t, torch.arange(m), deltas, torch.arange(1, m + 1), torch.zeros(m), None)


def test_dpfedavg_is_the_noisy_clipped_sum_over_a_fixed_denominator():
    u = _fc_updates()
    clipped, _ = norm_clip(u.deltas, 1.5)
    s = DPFedAvg(clip=1.5, noise_multiplier=0.0)
    new, diag = s.aggregate(s.init_state(_params(u), None, 20, 0)[0], u)
    for k in u.deltas:  # no noise: the uniform mean of the clipped updates (sizes ignored)
        torch.testing.assert_close(new["params"][k], clipped[k].sum(0) / 6)
    assert bool((diag["clipped"] <= 1).all()) and diag["noise_std"] == 0
    s = DPFedAvg(clip=1.5, noise_multiplier=0.7, denominator=10)
    state = s.init_state(_params(u), None, 20, 5)[0]
    new, diag = s.aggregate(state, u)
    again, _ = s.aggregate(state, u)
    noise = {k: new["params"][k] * 10 - clipped[k].sum(0) for k in u.deltas}
    assert all(torch.equal(new["params"][k], again["params"][k]) for k in u.deltas)  # seeded by seed and round
    assert diag["noise_std"] == pytest.approx(0.7 * 1.5 / 10)
    other_round, _ = s.aggregate(state, _fc_updates(t=2))
    assert not torch.equal(other_round["params"]["fc.bias"], new["params"]["fc.bias"])
    big = {"w": torch.zeros(200, 50)}
    n = s.noise(big, 5, 1)["w"]
    assert abs(float(n.std()) - 0.7 * 1.5) < 0.03 and abs(float(n.mean())) < 4 * 0.7 * 1.5 / 100  # 4 standard errors
    expected = s.noise({"fc.weight": torch.zeros(4, 3), "fc.bias": torch.zeros(4)}, 5, 1)
    for k in u.deltas:
        torch.testing.assert_close(noise[k], expected[k], atol=1e-5, rtol=0)


def test_one_client_moves_the_clipped_sum_by_at_most_clip():
    """The sensitivity the noise is calibrated to: add a client (of any size) -> the sum moves <= C."""
    u = _fc_updates(m=7, seed=3)
    clipped, _ = norm_clip(u.deltas, 0.8)
    without, _ = norm_clip({k: v[:6] for k, v in u.deltas.items()}, 0.8)
    moved = torch.cat([(clipped[k].sum(0) - without[k].sum(0)).reshape(-1) for k in clipped]).norm()
    assert float(moved) <= 0.8 * (1 + 1e-6)


def test_reweighting_a_private_strategy_is_refused():
    val = (torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="FedVG over dpfedavg cannot work: .*privacy guarantee would not hold"):
        FedVG(val, base=DPFedAvg())


def test_loop_and_vmap_engines_give_the_same_private_run():
    fed = federated_dataset("digits", num_clients=8, alpha=0.5, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    a = simulate(fed, model, DPFedAvg(clip=0.5, noise_multiplier=0.5), engine="loop", **PRIVATE_KW)
    b = simulate(fed, model, DPFedAvg(clip=0.5, noise_multiplier=0.5), engine="vmap", **PRIVATE_KW)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a.client_accuracy, b.client_accuracy, atol=1e-6)


def test_noise_beyond_the_parameters_dtype_names_noise_multiplier():
    fed = federated_dataset("digits", num_clients=8, alpha=0.5, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    # was: "... turned finite client updates into a NaN/Inf direction" and nothing more
    with pytest.raises(
        FloatingPointError,
        match=r"noise_multiplier \* clip \(now 1e\+300 \* 1\.0\), too large .*lower noise_multiplier",
    ):
        simulate(fed, model, DPFedAvg(noise_multiplier=1e300), **{**PRIVATE_KW, "rounds": 1})

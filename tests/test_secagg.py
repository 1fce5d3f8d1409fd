"""Secure aggregation: the sum is exact, strict subsets of masked inputs are noise; which strategies survive it."""

from __future__ import annotations

import math

import pytest
import torch

from fedlearn_edu import IFCA, SCAFFOLD, Ditto, FedAvg, FedVG, LocalOnly, federated_dataset, make_model, simulate
from fedlearn_edu.secagg import (
    NEEDS_EACH,
    check_secure_aggregation,
    decode,
    encode,
    mask_inputs,
    pairwise_masks,
    secure_aggregation_problem,
    secure_sum,
)
from fedlearn_edu.strategies import STRATEGIES

VAL = (torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))


def _make(name):
    return STRATEGIES[name](VAL) if name == "fedvg" else STRATEGIES[name](2) if name == "ifca" else STRATEGIES[name]()


def test_encoding_round_trips_in_fixed_point():
    x = torch.tensor([-3.25, 0.0, 1e-6, 2.5, -1e3], dtype=torch.float64)
    y = encode(x, 16, 48)
    assert y.dtype == torch.int64 and bool((y >= 0).all() and (y < 2**48).all())
    torch.testing.assert_close(decode(y, 16, 48), torch.round(x * 2**16) / 2**16, rtol=0, atol=0)
    with pytest.raises(ValueError, match="reaches 2\\^31"):
        encode(torch.tensor([1e5]), 16, 32)


def test_masks_cancel_and_the_sum_is_exact():
    g = torch.Generator().manual_seed(0)
    deltas = {"w": torch.randn(7, 5, 3, generator=g, dtype=torch.float64), "b": torch.randn(7, 5, generator=g)}
    ids = torch.tensor([0, 2, 3, 5, 8, 9, 11])
    masks = pairwise_masks(ids, (4,), seed=1)
    assert not bool((masks == 0).all()) and bool((torch.remainder(masks.sum(0), 2**48) == 0).all())
    total, masked = secure_sum(deltas, ids, seed=3)
    for k, v in deltas.items():
        rounded = torch.round(v.double() * 2**16) / 2**16
        torch.testing.assert_close(total[k], rounded.sum(0), rtol=0, atol=0)  # exact in fixed point
        assert float((total[k] - v.double().sum(0)).abs().max()) <= 7 * 2.0**-17
        assert masked[k].shape == v.shape and masked[k].dtype == torch.int64


def test_a_strict_subset_of_masked_inputs_is_uncorrelated_with_the_inputs():
    """m - 1 of the y_i (any client left out) are uniform modulo 2^k: across many sessions their
    decoded values do not correlate with the true inputs, and look uniform."""
    m, d, sessions = 5, 200, 40
    g = torch.Generator().manual_seed(7)
    ids = torch.arange(m)
    xs, ys = [], []
    for session in range(sessions):
        x = torch.randn(m, d, generator=g, dtype=torch.float64)
        y = mask_inputs(encode(x, 16, 32), ids, seed=session, modulus_bits=32)
        xs.append(x[: m - 1].reshape(-1))
        ys.append(y[: m - 1].reshape(-1).double() / 2**32)  # in [0, 1)
    x, y = torch.cat(xs), torch.cat(ys)
    n = x.numel()
    corr = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
    assert abs(corr) < 4 / n**0.5  # |r| within 4 standard errors of 0
    assert abs(float(y.mean()) - 0.5) < 4 * (1 / 12) ** 0.5 / n**0.5  # uniform: mean 1/2, variance 1/12
    assert abs(float(y.var()) - 1 / 12) < 0.01
    # the same inputs unmasked are perfectly correlated with themselves (the test can fail)
    plain = torch.cat([encode(v.reshape(-1), 16, 32).double() for v in xs])
    assert float(torch.corrcoef(torch.stack([x, decode(plain.long(), 16, 32)]))[0, 1]) > 0.99


SUMS_ONLY = {"fedavg", "fedavgm", "fedprox", "fedadam", "fedyogi", "fedadagrad", "scaffold", "feddyn", "fednova"}
SUMS_ONLY |= {"normclipping", "dpfedavg", "ditto"}  # Ditto: its base's (FedAvg's) sums


def test_the_secure_aggregation_table():
    """Which registered strategies need only sums (and the reason for every other one)."""
    table = {name: secure_aggregation_problem(_make(name)) for name in STRATEGIES}
    assert {n for n, why in table.items() if not why} == SUMS_ONLY
    for name, why in table.items():
        if name in NEEDS_EACH:
            assert NEEDS_EACH[name] in why
    assert "each client's model theta_i" in table["fedvg"] and "Gram matrix" in table["craft"]
    assert "OUI" in table["fedoui"] and "pairwise distances" in table["krum"]
    assert "no server aggregation" in table["gossip"] and "no server aggregation" in table["dac"]
    assert secure_aggregation_problem(Ditto(0.1)) == ""  # the base's (FedAvg's) sums; personal steps stay local
    assert "each client's model" in secure_aggregation_problem(Ditto(0.1, base=FedVG(VAL)))
    assert "cluster choice" in secure_aggregation_problem(IFCA(2))
    assert "no server aggregation" in secure_aggregation_problem(LocalOnly())
    assert "over scaffold" in secure_aggregation_problem(FedVG(VAL, base=SCAFFOLD()))


def test_simulate_refuses_a_strategy_that_needs_each_update():
    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    kw = dict(rounds=1, clients_per_round=3, batch_size=16, progress=False, device="cpu", engine="loop")
    with pytest.raises(ValueError, match="krum cannot run under secure aggregation .*pairwise distances"):
        simulate(fed, model, _make("krum"), secure_aggregation=True, **kw)
    check_secure_aggregation(FedAvg())
    h = simulate(fed, model, FedAvg(), secure_aggregation=True, **kw)
    ref = simulate(fed, model, FedAvg(), **kw)
    assert h.config["secure_aggregation"] is True and "secure_aggregation" not in ref.config
    assert all(torch.equal(h.final_params[k], ref.final_params[k]) for k in ref.final_params)


def test_a_sum_that_can_pass_the_field_is_refused():
    x = torch.full((4, 3), 2.0**30, dtype=torch.float64)  # each fits 2^47 at s = 16; their sum 2^48 does not
    encode(x, 16, 48)
    with pytest.raises(
        ValueError,
        match=r"^inputs: the 4 clients' fixed-point magnitudes .* add up to 2\.815e\+14 = "
        r"2\^48\.0 .* 2\^\(k-1\) = 2\^47 \(scale_bits=16, modulus_bits=48\)",
    ):
        secure_sum(x, torch.arange(4), seed=0)  # was: 0.0 for every coordinate
    with pytest.raises(ValueError, match=r"^inputs\['w'\]: the 4 clients"):
        secure_sum({"b": torch.ones(4, 2), "w": x}, torch.arange(4), seed=0)
    # opposite signs do not save it: the field must hold whatever the signs
    with pytest.raises(ValueError, match="could wrap around"):
        secure_sum(x * torch.tensor([[1.0], [-1.0], [1.0], [-1.0]], dtype=torch.float64), torch.arange(4), seed=0)
    total, _ = secure_sum(x, torch.arange(4), seed=0, modulus_bits=50)  # two more bits: the exact sum
    assert torch.equal(total, torch.full((3,), 2.0**32, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"add up to 1\.407e\+14 = 2\^47\.0"):  # 2^(k-1) itself is out
        secure_sum(x[:, :1] / 2, torch.arange(4), seed=0)
    total, _ = secure_sum(x[:, :1] / 4, torch.arange(4), seed=0)  # 2^46 fits
    assert float(total) == 2.0**30


def test_encode_refuses_nan_and_inf():
    for bad in (math.nan, math.inf, -math.inf):  # was: NaN encoded as 0 (and Inf as a huge code)
        with pytest.raises(ValueError, match=r"^encode: x holds 1 NaN or Inf value\(s\) of 3"):
            encode(torch.tensor([1.0, bad, 0.0]))
    with pytest.raises(TypeError, match="^encode: x must be a floating-point Tensor, got list"):
        encode([1.0])
    assert torch.equal(encode(torch.tensor([1, -2])), torch.tensor([2**16, 2**48 - 2**17]))  # integers still fine


def test_client_ids_must_be_distinct_integers_one_per_row():
    x = torch.ones(3, 2, dtype=torch.float64)
    for call in (secure_sum, lambda x, ids, seed: mask_inputs(encode(x), ids, seed)):
        # was: float ids truncated (1.5 -> 1), silently
        with pytest.raises(
            TypeError, match=r"^client_ids must be integer client ids .* Tensor of torch.float32; a float id"
        ):
            call(x, torch.tensor([0.0, 1.5, 2.0]), seed=0)
        with pytest.raises(ValueError, match=r"^client_ids must be distinct, got \[0, 1, 1\]"):
            call(x, torch.tensor([0, 1, 1]), seed=0)
    with pytest.raises(ValueError, match=r"^client_ids has 2 ids for the 3 clients \(rows\) of inputs"):
        secure_sum(x, torch.tensor([0, 1]), seed=0)
    with pytest.raises(ValueError, match=r"^client_ids must be >= 0, got -1"):
        secure_sum(x, [0, -1, 2], seed=0)
    with pytest.raises(TypeError, match=r"^client_ids must be an integer, got 1.0"):
        secure_sum(x, [0, 1.0, 2], seed=0)
    total, masked = secure_sum(x, [4, 0, 9], seed=0)  # a list of ints is the same as the tensor
    again, masked_again = secure_sum(x, torch.tensor([4, 0, 9]), seed=0)
    assert torch.equal(total, again) and torch.equal(masked, masked_again)


def test_too_many_scale_bits_for_the_modulus_names_both():
    with pytest.raises(ValueError, match=r"^scale_bits must be <= modulus_bits - 2 = 6 \(modulus_bits=8\), got 16"):
        secure_sum(torch.ones(3, 2), torch.arange(3), seed=0, modulus_bits=8)  # was: "scale_bits must be <= 6"
    with pytest.raises(ValueError, match=r"^scale_bits must be <= modulus_bits - 2 = 46"):
        encode(torch.ones(2), scale_bits=47)


def test_a_users_wrapper_that_changes_the_server_step_does_not_inherit_sums_only_or_privacy():
    """Over FedAvg (sums only) or DP-FedAvg (private), a wrapper with its own direction may read each update."""
    from fedlearn_edu import DPFedAvg
    from fedlearn_edu.strategies import Wrapper

    class Halved(Wrapper):
        def direction(self, server_state, updates):
            g, state, diag = super().direction(server_state, updates)
            return {k: 0.5 * v for k, v in g.items()}, state, diag

    class SameStep(Wrapper):
        pass

    assert SameStep(FedAvg()).needs.sums_only and secure_aggregation_problem(SameStep(FedAvg())) == ""
    assert not Halved(FedAvg()).needs.sums_only
    assert "each client's update" in secure_aggregation_problem(Halved(FedAvg()))
    private = DPFedAvg(clip=1.0, noise_multiplier=1.0)
    assert SameStep(private).needs.private and not Halved(private).needs.private

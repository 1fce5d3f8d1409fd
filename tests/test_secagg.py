"""Secure aggregation (:mod:`fedlearn_edu.secagg`): the sum is exact, strict subsets of masked inputs are
noise; which strategies survive it; Shamir secret sharing and dropout recovery (Bonawitz et al., CCS 2017)."""

from __future__ import annotations

import itertools
import math
import warnings
from collections import Counter

import pytest
import torch

from fedlearn_edu import IFCA, SCAFFOLD, Ditto, FedAvg, FedVG, LocalOnly, federated_dataset, make_model, simulate
from fedlearn_edu.secagg import (
    NEEDS_EACH,
    PRIME,
    check_secure_aggregation,
    decode,
    encode,
    mask_inputs,
    pairwise_masks,
    secret_keys,
    secure_aggregation_problem,
    secure_sum,
    shamir_reconstruct,
    shamir_share,
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
    # FedVG is refused as the book runs it (server-side validation gradients), not in every form
    assert "as this book runs FedVG" in table["fedvg"] and "client-side scores" in table["fedvg"]
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
        wraps = {"server"}

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


def _poly(coefficients, x, p):
    return sum(a * x**e for e, a in enumerate(coefficients)) % p


def test_any_t_shares_reconstruct_the_secret():
    secret = 1234567890123456789 % PRIME
    shares = shamir_share(secret, threshold=3, num_shares=6, seed=5)
    assert [x for x, _ in shares] == [1, 2, 3, 4, 5, 6] and all(0 <= y < PRIME for _, y in shares)
    for subset in itertools.combinations(shares, 3):
        assert shamir_reconstruct(list(subset)) == secret
    for subset in itertools.combinations(shares, 5):  # more than t: the same polynomial
        assert shamir_reconstruct(list(subset)) == secret
    # the shares are the evaluations of one polynomial of degree t - 1 with f(0) = secret:
    # interpolating through (0, secret) and two shares predicts every other share
    p = 101
    small = shamir_share(42, 3, 7, seed=1, prime=p)
    (x1, y1), (x2, y2) = small[0], small[3]
    # solve a1, a2 from f(x1) = y1, f(x2) = y2 with f(0) = 42 (2x2 system mod p, by brute force)
    sols = [
        (a1, a2)
        for a1 in range(p)
        for a2 in range(p)
        if _poly([42, a1, a2], x1, p) == y1 and _poly([42, a1, a2], x2, p) == y2
    ]
    assert len(sols) == 1
    assert all(_poly([42, *sols[0]], x, p) == y for x, y in small)
    assert shamir_share(7, 1, 4, seed=0, prime=p) == [(1, 7), (2, 7), (3, 7), (4, 7)]  # t = 1: the secret itself


def test_t_minus_one_shares_are_uninformative():
    """Over GF(13) with t = 3: for every pair of share positions, the two shares' joint
    distribution (over the uniform coefficients) is the same for every secret -- uniform on
    GF(13)^2 -- so every secret is equally consistent with them."""
    p, t = 13, 3
    for xs in [(1, 2), (3, 7), (5, 12)]:
        for secret in range(p):
            seen = Counter(
                tuple(_poly([secret, a1, a2], x, p) for x in xs) for a1, a2 in itertools.product(range(p), repeat=t - 1)
            )
            assert len(seen) == p**2 and set(seen.values()) == {1}
    # the package's shares: given t - 1 of them, each candidate secret completes to exactly one
    # polynomial of degree t - 1 (interpolate through (0, candidate)), consistent with the shares
    shares = shamir_share(9, t, 5, seed=3, prime=p)[:2]
    completions = Counter()
    for candidate in range(p):
        third = [(x, _interpolate([(0, candidate), *shares], x, p)) for x in range(1, p)]
        assert shamir_reconstruct(third[:3], prime=p) == candidate
        assert all(dict(third)[x] == y for x, y in shares)
        completions[candidate] += 1
    assert set(completions.values()) == {1} and len(completions) == p
    # with t - 1 shares the reconstruction is not the secret in general (another polynomial)
    wrong = sum(shamir_reconstruct(shamir_share(9, t, 5, seed=s, prime=p)[:2], prime=p) != 9 for s in range(50))
    assert wrong > 40


def _interpolate(points, x, p):
    total = 0
    for j, (xj, yj) in enumerate(points):
        num = den = 1
        for m, (xm, _) in enumerate(points):
            if m != j:
                num = num * (x - xm) % p
                den = den * (xj - xm) % p
        total = (total + yj * num * pow(den, -1, p)) % p
    return total


def test_the_pair_seeds_agree_from_both_sides_and_the_masks_cancel():
    ids = torch.tensor([0, 3, 4, 8, 9])
    keys = secret_keys(ids, 7)
    assert all(1 <= k <= PRIME - 2 for k in keys.values()) and len(set(keys.values())) == 5
    for i, j in itertools.combinations(keys, 2):  # g^(k_i k_j) from either side
        assert pow(pow(3, keys[j], PRIME), keys[i], PRIME) == pow(pow(3, keys[i], PRIME), keys[j], PRIME)
    masks = pairwise_masks(ids, (6,), seed=7)
    assert bool((torch.remainder(masks.sum(0), 2**48) == 0).all()) and not bool((masks == 0).all())


def test_the_sum_with_dropouts_is_exactly_the_survivors_sum():
    g = torch.Generator().manual_seed(0)
    deltas = {"w": torch.randn(7, 4, 3, generator=g, dtype=torch.float64), "b": torch.randn(7, 4, generator=g)}
    ids = torch.tensor([0, 2, 3, 5, 8, 9, 11])
    before = {k: v.clone() for k, v in deltas.items()}
    for dropped, t in [([5], 4), ([2, 11], 4), ([0, 3, 9], 4), ([0, 2, 3, 5, 8], 2), ([], 7)]:
        total, masked = secure_sum(deltas, ids, seed=3, dropped=dropped, threshold=t)
        keep = torch.tensor([int(i) not in dropped for i in ids])
        for k, v in deltas.items():
            rounded = torch.round(v.double() * 2**16) / 2**16
            torch.testing.assert_close(total[k], rounded[keep].sum(0), rtol=0, atol=0)  # exact
            assert masked[k].shape == (int(keep.sum()), *v.shape[1:])
    assert all(torch.equal(deltas[k], before[k]) for k in deltas)
    # without the recovery the survivors' masked sum is noise: far from their sum
    total, masked = secure_sum(deltas["b"], ids, seed=3, dropped=[5], threshold=4)
    raw = decode(torch.remainder(masked.sum(0), 2**48), 16, 48)
    assert float((raw - total).abs().max()) > 1e3
    # no dropout: the same sum as before, all rows received
    full, masked = secure_sum(deltas["b"], ids, seed=3)
    torch.testing.assert_close(full, (torch.round(deltas["b"].double() * 2**16) / 2**16).sum(0), rtol=0, atol=0)
    assert masked.shape == deltas["b"].shape


def test_too_few_survivors_and_bad_arguments_are_refused():
    x = torch.randn(5, 3, dtype=torch.float64)
    ids = torch.arange(5)
    with pytest.raises(ValueError, match=r"Only 2 of the 5 clients survived, fewer than the threshold t=3"):
        secure_sum(x, ids, seed=0, dropped=[0, 1, 2])  # majority threshold: t = 3
    with pytest.raises(ValueError, match=r"Only 3 of the 5 clients survived, fewer than the threshold t=4"):
        secure_sum(x, ids, seed=0, dropped=torch.tensor([1, 4]), threshold=4)
    secure_sum(x, ids, seed=0, dropped=[1, 4], threshold=3)
    with pytest.raises(ValueError, match=r"dropped names clients \[7\] that are not among client_ids"):
        secure_sum(x, ids, seed=0, dropped=[7])
    with pytest.raises(ValueError, match=r"threshold must be"):
        secure_sum(x, ids, seed=0, dropped=[1], threshold=6)
    with pytest.raises(ValueError, match=r"threshold must be"):
        shamir_share(3, 4, 3, seed=0)
    with pytest.raises(ValueError, match=r"secret must be"):
        shamir_share(PRIME, 2, 3, seed=0)
    with pytest.raises(ValueError, match=r"distinct x"):
        shamir_reconstruct([(1, 2), (1, 3)])


def test_shamir_refuses_a_composite_prime_and_non_integer_shares():
    with pytest.raises(ValueError, match=r"^prime must be a prime number .*, got 15, which is composite"):
        shamir_share(42, 2, 3, seed=0, prime=15)  # was: shares whose interpolation gives a wrong secret
    with pytest.raises(ValueError, match=r"^prime must be a prime number .*, got 2047"):  # 2^11 - 1 = 23 * 89
        shamir_reconstruct([(1, 2), (2, 3)], prime=2047)
    for prime in (101, 2**31 - 1, PRIME, 2**89 - 1):
        assert shamir_reconstruct(shamir_share(42, 2, 3, seed=1, prime=prime)[1:], prime=prime) == 42
    shares = shamir_share(42, 2, 3, seed=0, prime=101)
    for bad in [(1, 2.5), (1.0, shares[0][1]), (1,), "ab"]:  # was: 2.5 -> 2 and 1.0 -> 1, a wrong secret
        with pytest.raises(TypeError, match=r"^shares must be \(x, y\) pairs of integers, got "):
            shamir_reconstruct([bad, shares[1]], prime=101)


def test_a_threshold_of_at_most_half_the_clients_is_warned_about():
    x = torch.randn(6, 3, dtype=torch.float64)
    with pytest.warns(
        UserWarning, match=r"^threshold=3 <= m / 2 = 3 \(m = 6 clients\) is unsafe: .* use threshold > m / 2"
    ):
        total, _ = secure_sum(x, torch.arange(6), seed=0, dropped=[1], threshold=3)
    keep = torch.tensor([i != 1 for i in range(6)])
    torch.testing.assert_close(total, (torch.round(x * 2**16) / 2**16)[keep].sum(0), rtol=0, atol=0)  # still exact
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        secure_sum(x, torch.arange(6), seed=0, dropped=[1], threshold=4)
        secure_sum(x, torch.arange(6), seed=0)  # None: a majority, m // 2 + 1


def test_dropped_ids_and_the_seed_are_not_truncated():
    x = torch.randn(5, 3, dtype=torch.float64)
    ids = torch.arange(5)
    # was: dropped=tensor([1.7]) dropped client 1, and seed=1.5 ran with seed 1
    with pytest.raises(TypeError, match=r"^dropped must be integer client ids .* Tensor of torch.float32"):
        secure_sum(x, ids, seed=0, dropped=torch.tensor([1.7]))
    with pytest.raises(TypeError, match=r"^dropped must be an integer, got 1.7"):
        secure_sum(x, ids, seed=0, dropped=[1.7])
    with pytest.raises(TypeError, match=r"^dropped must be integer client ids .*, got 3 \(int\)"):
        secure_sum(x, ids, seed=0, dropped=3)
    with pytest.raises(TypeError, match=r"^seed must be an integer, got 1.5"):
        secure_sum(x, ids, seed=1.5)
    a, _ = secure_sum(x, ids, seed=0, dropped=torch.tensor([[1], [4]]))  # any shape of int tensor, as before
    b, _ = secure_sum(x, ids, seed=0, dropped={4, 1})  # any iterable of ints
    assert torch.equal(a, b)

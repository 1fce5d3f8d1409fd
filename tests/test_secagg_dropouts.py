"""Shamir secret sharing and dropout recovery in secure aggregation (Bonawitz et al., CCS 2017)."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter

import pytest
import torch

from fedlearn_edu.secagg import PRIME, decode, pairwise_masks, secret_keys, secure_sum, shamir_reconstruct, shamir_share


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

"""A simulation of pairwise-masked secure aggregation (Bonawitz et al., CCS 2017), and which strategies survive it.

The clients' inputs ``x_i`` (``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``) are encoded in
fixed point modulo ``2^k`` (``round(x 2^s)``, s fractional bits). Every pair of clients
(i, j) shares a seed ``s_ij`` (in the protocol: from a Diffie-Hellman key agreement; here
derived from a session seed), and client i sends

    ``y_i = x_i + sum_{j > i} PRG(s_ij) - sum_{j < i} PRG(s_ji)  (mod 2^k)``.

Every mask appears once with ``+`` and once with ``-``, so ``sum_i y_i = sum_i x_i (mod 2^k)``:
the server learns the sum (exactly, in fixed point: the sum of the rounded inputs, when
``|sum| < 2^(k-1-s)``; :func:`secure_sum` refuses inputs whose sum of magnitudes could
pass that range, since the decoded sum would wrap around) and, from a strict subset of the
``y_i``, nothing -- each such ``y_i`` is uniform modulo ``2^k`` whatever ``x_i``.

**Pair seeds** come from a key agreement, as in the protocol: client i holds a secret key
``k_i`` (derived from the session seed) and publishes ``pk_i = g^(k_i) mod p``; the pair seed
is ``s_ij = H(pk_j^(k_i)) = H(g^(k_i k_j)) = s_ji`` (``p = 2^61 - 1``, :data:`PRIME`). It is a
*toy* Diffie-Hellman over a 61-bit field (a discrete logarithm there is within reach): the
simulation shows the protocol's arithmetic, it is not cryptography.

**Dropouts** (Bonawitz et al., Section 4). If client j drops after the masks are fixed, its
``y_j`` never arrives and the survivors' masks with j no longer cancel. So, before masking,
every client Shamir-shares its secret key among the m clients (t-of-m, :func:`shamir_share`):
a random polynomial ``f(x) = k_i + a_1 x + ... + a_{t-1} x^(t-1)`` over the field, client i's
share for the client at position r being ``(r, f(r))``. Any t shares give ``k_i = f(0)`` by
Lagrange interpolation (:func:`shamir_reconstruct`); t - 1 shares say nothing about it: for
every candidate secret there is exactly one polynomial of degree t - 1 through them and
``(0, candidate)``, so each secret is equally consistent with them. When clients drop
(``secure_sum(..., dropped=ids, threshold=t)``), the server asks t survivors for their
shares of each dropped key, rebuilds ``k_j``, recomputes ``s_ij = H(pk_i^(k_j))`` with every
survivor i and removes those masks: the sum it decodes is exactly the survivors' sum. With
fewer than t survivors it cannot (``ValueError``). A threshold ``t > m / 2`` also keeps
a server from rebuilding the keys of two disjoint groups; ``secure_sum`` computes the sum
with a smaller t too (to show the arithmetic) but warns (``UserWarning``) that such a
threshold is unsafe. Not simulated: the protocol's
second, *self* mask ``b_i`` (also Shamir-shared; the server learns, per client, either
``b_i`` or ``k_i``, never both), which stops a server from unmasking a client it falsely
declares dropped after its ``y_i`` arrived; authenticated channels; dropouts during the
recovery itself. SecAgg+ (Bell et al. 2020) replaces the complete graph of pairs by a sparse
random graph of O(log m) neighbours.

Which strategies can run under it: those whose server step needs only sums of
client-computed vectors (``Strategy.needs.sums_only``): FedAvg and its server optimizers
(FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad; the clients send ``n_i Delta_i`` and ``n_i``),
SCAFFOLD (sums of ``Delta_i`` and ``Delta c_i``), FedDyn, FedNova (``sum p_i tau_i`` and
``sum p_i Delta_i / tau_i``), norm clipping and DP-FedAvg (clients clip). The others read
each client's update or signal: :data:`NEEDS_EACH` says what, and what would have to be
revealed or computed securely instead. ``simulate(..., secure_aggregation=True)`` refuses them
(:func:`check_secure_aggregation`) with that reason.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import replace
from functools import lru_cache

import torch
from torch import Tensor

from .checks import Updates, check_int, check_seed, check_updates
from .strategies.wrapper import Wrapper
from .utils import derive_seed

__all__ = [
    "PRIME",
    "encode",
    "decode",
    "shamir_share",
    "shamir_reconstruct",
    "secret_keys",
    "pairwise_masks",
    "mask_inputs",
    "secure_sum",
    "NEEDS_EACH",
    "secure_aggregation_problem",
    "check_secure_aggregation",
]

_TAG_PAIR = 0x5EC466
_TAG_KEY, _TAG_SHARE = 0x5EC4E1, 0x5EC5A4

PRIME = 2**61 - 1
"""The field of the key agreement and of the Shamir shares: the Mersenne prime ``2^61 - 1``."""
_GENERATOR = 3


@lru_cache(maxsize=64)
def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first 13 primes as bases: exact for n < 3.3e24, a strong test above."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n < 2:
        return False
    for b in bases:
        if n % b == 0:
            return n == b
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for b in bases:
        x = pow(b, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _check_prime(prime) -> int:
    p = check_int(prime, "prime", 3)
    if not _is_prime(p):
        raise ValueError(
            f"prime must be a prime number (the shares are computed in the field of integers modulo p), "
            f"got {prime!r}, which is composite; the default is PRIME = 2^61 - 1."
        )
    return p


def _check_ids(values, name: str = "client_ids", rows: int | None = None, distinct: bool = True) -> list[int]:
    """``values`` (an integer Tensor or an iterable of ints) as non-negative Python ints, never truncating floats.

    Distinct unless ``distinct=False``; one per input row when ``rows`` is given.
    """
    what = f"{name} must be integer client ids (an integer Tensor or a list of ints)"
    if isinstance(values, Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{what}, got a Tensor of {values.dtype}; a float id would be truncated.")
        if values.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one id per client), got shape {tuple(values.shape)}.")
        values = values.tolist()
    elif isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what}, got {values!r} ({type(values).__name__}).")
    ids = [check_int(i, name, 0) for i in values]
    if distinct and len(set(ids)) != len(ids):
        raise ValueError(f"{name} must be distinct, got {ids!r}.")
    if rows is not None and len(ids) != rows:
        raise ValueError(f"{name} has {len(ids)} ids for the {rows} clients (rows) of inputs; give one id per row.")
    return ids


def _check_bits(scale_bits, modulus_bits) -> tuple[int, int]:
    k = check_int(modulus_bits, "modulus_bits", 8, 62)
    s = check_int(scale_bits, "scale_bits", 0)
    if s > k - 2:
        raise ValueError(f"scale_bits must be <= modulus_bits - 2 = {k - 2} (modulus_bits={k}), got {scale_bits!r}.")
    return s, k


def encode(x: Tensor, scale_bits: int = 16, modulus_bits: int = 48) -> Tensor:
    """Fixed-point encoding modulo ``2^k``: ``round(x 2^s) mod 2^k`` (int64).

    Args:
        x: a floating-point tensor.
        scale_bits: s, the fractional bits.
        modulus_bits: k (<= 62).

    Returns:
        An int64 tensor with values in ``[0, 2^k)``.

    Raises:
        TypeError: ``x`` is not a tensor.
        ValueError: ``x`` holds NaN or Inf (which have no fixed-point code), or ``|x| 2^s`` does
            not fit in ``2^(k-1)`` (it would wrap around).
    """
    s, k = _check_bits(scale_bits, modulus_bits)
    if not isinstance(x, Tensor):
        raise TypeError(f"encode: x must be a floating-point Tensor, got {type(x).__name__}.")
    bad = int((~torch.isfinite(x)).sum()) if x.is_floating_point() or x.is_complex() else 0
    if bad:
        raise ValueError(
            f"encode: x holds {bad} NaN or Inf value(s) of {x.numel()}; only finite numbers have a fixed-point code."
        )
    q = torch.round(x.double() * 2.0**s)
    if q.numel() and float(q.abs().max()) >= 2.0 ** (k - 1):
        raise ValueError(f"encode: |x| * 2^{s} reaches 2^{k - 1}; use fewer scale_bits or more modulus_bits.")
    return torch.remainder(q.to(torch.int64), 2**k)


def decode(y: Tensor, scale_bits: int = 16, modulus_bits: int = 48) -> Tensor:
    """Inverse of :func:`encode`: values ``>= 2^(k-1)`` are negative; divided by ``2^s`` (float64).

    Args:
        y: int64 values in ``[0, 2^k)``.
        scale_bits: s.
        modulus_bits: k.

    Returns:
        A float64 tensor.

    Raises:
        TypeError: ``y`` is not an integer tensor (a float tensor is not a code: decoding it gives garbage).
    """
    s, k = _check_bits(scale_bits, modulus_bits)
    if not isinstance(y, Tensor) or y.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        what = y.dtype if isinstance(y, Tensor) else type(y).__name__
        raise TypeError(f"decode: y must be an integer Tensor of codes from encode (int64), got {what}.")
    y = torch.remainder(y.to(torch.int64), 2**k)
    signed = torch.where(y >= 2 ** (k - 1), y - 2**k, y)
    return signed.double() / 2.0**s


def shamir_share(secret: int, threshold: int, num_shares: int, seed: int, prime: int = PRIME) -> list[tuple[int, int]]:
    """Shamir's t-of-n secret sharing: the points ``(x, f(x))``, x = 1..n, of a random f with ``f(0) = secret``.

    ``f(x) = secret + a_1 x + ... + a_{t-1} x^(t-1) (mod p)`` with ``a_1..a_{t-1}`` uniform in
    ``[0, p)`` (from ``seed``: a reproducible simulation, not a cryptographic generator).

    Args:
        secret: an integer in ``[0, p)``.
        threshold: t in ``[1, n]``, the number of shares that reconstruct the secret.
        num_shares: n in ``[1, p)``.
        seed: the polynomial's seed.
        prime: p, the field's modulus, a prime.

    Returns:
        ``[(x, f(x)) for x in 1..n]`` (Python ints).

    Raises:
        TypeError: an argument is not an integer.
        ValueError: an argument out of range, or ``prime`` is composite (the interpolation
            would give a wrong secret).

    Example:
        >>> shares = shamir_share(42, threshold=2, num_shares=3, seed=0, prime=101)
        >>> shamir_reconstruct(shares[1:], prime=101)
        42
    """
    prime = _check_prime(prime)
    n = check_int(num_shares, "num_shares", 1, prime - 1)
    t = check_int(threshold, "threshold", 1, n)
    secret = check_int(secret, "secret", 0, prime - 1)
    rng = random.Random(check_seed(seed))
    coefficients = [secret] + [rng.randrange(prime) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for a in reversed(coefficients):  # Horner
            y = (y * x + a) % prime
        shares.append((x, y))
    return shares


def shamir_reconstruct(shares, prime: int = PRIME) -> int:
    """The secret ``f(0)`` from t shares, by Lagrange interpolation over the field.

    ``f(0) = sum_j y_j prod_{l != j} x_l / (x_l - x_j)  (mod p)``. Given at least t shares of a
    t-of-n sharing it is the secret; given fewer, some other number (they do not determine it).

    Args:
        shares: ``[(x, y), ...]`` with distinct ``x`` in ``[1, p)``.
        prime: p.

    Returns:
        ``f(0)`` in ``[0, p)`` for the polynomial of degree < ``len(shares)`` through the shares.

    Raises:
        TypeError: a share is not a pair of integers (a float would be truncated).
        ValueError: no shares, repeated or out-of-range ``x``, or a composite ``prime``.
    """
    prime = _check_prime(prime)
    points = []
    for share in shares:
        try:
            x, y = share
            points.append((check_int(x, "shares"), check_int(y, "shares") % prime))
        except (TypeError, ValueError):
            raise TypeError(f"shares must be (x, y) pairs of integers, got {share!r}.") from None
    xs = [x for x, _ in points]
    if not points or len(set(xs)) != len(xs) or not all(0 < x < prime for x in xs):
        raise ValueError(f"shares must be a non-empty list of (x, y) with distinct x in [1, p), got x = {xs!r}.")
    secret = 0
    for j, (xj, yj) in enumerate(points):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % prime
                den = den * (xm - xj) % prime
        secret = (secret + yj * num * pow(den, -1, prime)) % prime
    return secret


def secret_keys(client_ids: Tensor, seed: int) -> dict[int, int]:
    """Each client's secret key ``k_i`` in ``[1, p - 2]`` (from the session seed), for the pair seeds.

    Args:
        client_ids: ``Tensor[m]`` (integer dtype) or a list of distinct non-negative ints.
        seed: the session seed.

    Returns:
        ``{client id: k_i}``.

    Raises:
        TypeError: float (or other non-integer) ids.
        ValueError: negative or repeated ids.
    """
    seed = check_seed(seed)
    return {i: 1 + derive_seed(seed, i, _TAG_KEY) % (PRIME - 2) for i in _check_ids(client_ids)}


def _public_key(key: int) -> int:
    return pow(_GENERATOR, key, PRIME)


def _pair_mask(key: int, other_public: int, shape: tuple, k: int) -> Tensor:
    """``PRG(s_ij)`` with ``s_ij = H(pk_j^(k_i) mod p)``: the same from either side of the pair."""
    g = torch.Generator().manual_seed(derive_seed(pow(other_public, key, PRIME), _TAG_PAIR))
    return torch.randint(0, 2**k, tuple(shape), generator=g, dtype=torch.int64)


def pairwise_masks(client_ids: Tensor, shape: tuple, seed: int, modulus_bits: int = 48) -> Tensor:
    """Each client's total mask ``sum_{j > i} PRG(s_ij) - sum_{j < i} PRG(s_ji)  (mod 2^k)``.

    Args:
        client_ids: ``Tensor[m]`` the participating clients' ids (``j > i`` compares ids).
        shape: the shape of one client's input.
        seed: the session seed the clients' secret keys come from (:func:`secret_keys`); the
            pair seeds are ``s_ij = H(g^(k_i k_j) mod p)`` (see the module docstring).
        modulus_bits: k.

    Returns:
        ``Tensor[m, *shape]`` int64 in ``[0, 2^k)``; the rows sum to 0 modulo ``2^k``.

    Raises:
        TypeError: float (or other non-integer) ids.
        ValueError: negative or repeated ids.
    """
    k = check_int(modulus_bits, "modulus_bits", 8, 62)
    ids = _check_ids(client_ids)
    keys = secret_keys(ids, seed)
    m = len(ids)
    out = torch.zeros((m, *shape), dtype=torch.int64)
    for a in range(m):
        for b in range(a + 1, m):
            prg = _pair_mask(keys[ids[a]], _public_key(keys[ids[b]]), shape, k)
            low, high = (a, b) if ids[a] < ids[b] else (b, a)
            out[low] = torch.remainder(out[low] + prg, 2**k)
            out[high] = torch.remainder(out[high] - prg, 2**k)
    return out


def mask_inputs(encoded: Tensor, client_ids: Tensor, seed: int, modulus_bits: int = 48) -> Tensor:
    """What the clients send: ``y_i = encoded_i + mask_i (mod 2^k)``.

    Args:
        encoded: ``Tensor[m, ...]`` int64, the clients' encoded inputs.
        client_ids: ``Tensor[m]`` (integer dtype) or a list of distinct non-negative ints.
        seed: the session seed.
        modulus_bits: k.

    Returns:
        ``Tensor[m, ...]`` int64 in ``[0, 2^k)``.
    """
    masks = pairwise_masks(client_ids, tuple(encoded.shape[1:]), seed, modulus_bits)
    return torch.remainder(encoded.cpu() + masks, 2**modulus_bits)


def _check_dropped(ids: list[int], dropped, threshold) -> tuple[Tensor, int]:
    """``(survivors mask Tensor[m] bool, t)`` after checking ``dropped`` and ``threshold`` (warns when t <= m / 2)."""
    m = len(ids)
    t = m // 2 + 1 if threshold is None else check_int(threshold, "threshold", 1, max(m, 1))
    if 2 * t <= m:
        warnings.warn(
            f"threshold={t} <= m / 2 = {m / 2:g} (m = {m} clients) is unsafe: a server could rebuild the keys of "
            f"two disjoint groups of clients, declaring each dropped to the other, and unmask both; use "
            f"threshold > m / 2 (None: {m // 2 + 1}). The sum is computed all the same.",
            UserWarning,
            stacklevel=3,
        )
    if dropped is None:
        gone = []
    else:
        gone = _check_ids(dropped.reshape(-1) if isinstance(dropped, Tensor) else dropped, "dropped", distinct=False)
    unknown = sorted(set(gone) - set(ids))
    if unknown:
        raise ValueError(f"dropped names clients {unknown!r} that are not among client_ids {ids!r}.")
    survivors = torch.tensor([i not in set(gone) for i in ids], dtype=torch.bool)
    alive = int(survivors.sum())
    if gone and alive < t:
        raise ValueError(
            f"Only {alive} of the {m} clients survived, fewer than the threshold t={t}: the server cannot "
            f"rebuild the dropped clients' keys {sorted(gone)!r} (it needs t shares of each), so the round fails."
        )
    return survivors, t


def _check_sum_fits(inputs: Updates, s: int, k: int) -> None:
    """Refuse inputs whose fixed-point magnitudes add up to ``2^(k-1)`` or more at some coordinate."""
    for name, x in ({"": inputs} if isinstance(inputs, Tensor) else inputs).items():
        if not x.numel():
            continue
        worst = float(torch.round(x.double() * 2.0**s).abs().sum(0).max())  # sum_i |round(x_i 2^s)|
        if worst >= 2.0 ** (k - 1):
            where = f"[{name!r}]" if name else ""
            raise ValueError(
                f"inputs{where}: the {x.shape[0]} clients' fixed-point magnitudes |round(x_i 2^s)| add up to "
                f"{worst:.4g} = 2^{math.log2(worst):.1f} at some coordinate, not below the field's signed range "
                f"2^(k-1) = 2^{k - 1} (scale_bits={s}, modulus_bits={k}): the decoded sum could wrap around. "
                "Use fewer scale_bits or more modulus_bits (at most 62), or smaller inputs."
            )


def secure_sum(
    inputs: Updates,
    client_ids: Tensor,
    seed: int,
    scale_bits: int = 16,
    modulus_bits: int = 48,
    dropped=None,
    threshold: int | None = None,
) -> tuple[Updates, Updates]:
    """The server's view of one round: the masked inputs, and the sum it decodes from them.

    The protocol as simulated (module docstring): every client Shamir-shares its secret key
    t-of-m among the m clients and sends its masked input; the clients in ``dropped`` drop
    after masking (their inputs never arrive); the server rebuilds each dropped client's key
    from the shares of the first t survivors and removes its masks with the survivors, then
    decodes the sum. Without dropouts nothing is rebuilt.

    Args:
        inputs: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}`` the clients' vectors.
        client_ids: ``Tensor[m]`` (integer dtype) or a list of m distinct non-negative ints.
        seed: the session seed.
        scale_bits: s.
        modulus_bits: k.
        dropped: ids (a subset of ``client_ids``, list or ``Tensor``) of the clients that drop
            after masking; ``None`` or empty: no dropout.
        threshold: t in ``[1, m]``, the shares needed to rebuild a key (``None``: a
            majority, ``m // 2 + 1``); ``t <= m / 2`` is computed but warned about (unsafe:
            a server could unmask two disjoint groups, see the module docstring).

    Returns:
        ``(total, masked)``: the decoded sum of the *survivors'* inputs (float64, the inputs'
        structure without the client axis; equal to the sum of their fixed-point-rounded
        inputs) and the masked inputs ``y_i`` the server received (int64, the survivors' rows,
        in ``client_ids`` order).

    Raises:
        TypeError: float (or other non-integer) client ids, or arguments of the wrong type.
        ValueError: ``dropped`` names unknown clients, fewer than t clients survived, the
            client ids are negative, repeated or not one per row, or the inputs' magnitudes
            (in fixed point) add up to ``2^(k-1)`` or more at some coordinate, so that the
            decoded sum could wrap around (use fewer ``scale_bits`` or more ``modulus_bits``).

    Warns:
        UserWarning: ``threshold <= m / 2`` (unsafe; the sum is computed all the same).
    """
    m = check_updates(inputs, "inputs")
    seed = check_seed(seed)
    s, k = _check_bits(scale_bits, modulus_bits)
    ids = _check_ids(client_ids, rows=m)
    _check_sum_fits(inputs, s, k)
    survivors, t = _check_dropped(ids, dropped, threshold)
    alive = [i for i, ok in zip(ids, survivors.tolist()) if ok]

    def one(x: Tensor, salt: int) -> tuple[Tensor, Tensor]:
        session = derive_seed(seed, salt)
        keys = secret_keys(ids, session)
        # the "share keys" step: client i's key, t-of-m, one share for the client at position r + 1
        shares = {i: shamir_share(keys[i], t, len(ids), derive_seed(session, i, _TAG_SHARE)) for i in ids}
        y = mask_inputs(encode(x, s, k), ids, session, k)[survivors]  # what arrives
        total = torch.remainder(y.sum(0), 2**k)
        helpers = [r for r, i in enumerate(ids) if i in alive][:t]
        for j in (i for i in ids if i not in alive):
            key = shamir_reconstruct([shares[j][r] for r in helpers])  # k_j from t survivors' shares
            for i in alive:  # remove the mask between survivor i and the dropped j
                prg = _pair_mask(key, _public_key(keys[i]), tuple(x.shape[1:]), k)
                total = torch.remainder(total - prg if i < j else total + prg, 2**k)
        return decode(total, s, k), y

    if isinstance(inputs, Tensor):
        return one(inputs, 0)
    pairs = {name: one(x, i) for i, (name, x) in enumerate(inputs.items())}
    return {n: p[0] for n, p in pairs.items()}, {n: p[1] for n, p in pairs.items()}


# What each strategy that is not sums-only needs from every client, and what could replace it.
NEEDS_EACH = {
    "fedvg": "each client's model theta_i, to evaluate its validation gradient on the server, as this book runs "
    "FedVG (with the paper's client-side scores it would fit two phases, as FedOUI would: reveal the scores, "
    "then sum the weighted updates)",
    "fedoui": "each client's OUI score to weight it (would need revealing the scores, or securely computed weights)",
    "fedalign": "each client's alignment score to weight it (would need revealing the scores)",
    "craft": "each client's normalised update, for the Gram matrix U U^T (would need secure inner products)",
    "config": "each client's update, for the conflict-free direction (would need secure inner products)",
    "fedfv": "each client's update and loss, to project away conflicts pairwise",
    "qfedavg": "each client's loss F_i with its update (its two sums could be formed by the clients; not "
    "implemented so)",
    "afl": "each client's loss, for the mixture weights lambda (would need revealing the losses)",
    "fedlf": "each client's update, for the min-norm point of their hull",
    "ifca": "each client's cluster choice with its update (per-cluster secure sums would reveal the choices)",
    "median": "each client's update (order statistics per coordinate)",
    "trimmedmean": "each client's update (order statistics per coordinate)",
    "krum": "each client's update (pairwise distances)",
    "multikrum": "each client's update (pairwise distances)",
    "bulyan": "each client's update (pairwise distances, then order statistics)",
    "geometricmedian": "each client's update (distances to the iterate; RFA's secure variant needs a secure "
    "weighted sum per Weiszfeld step)",
    "centeredclipping": "each client's update minus the centre (with L = 1 the clients could clip locally and "
    "send a sum; not implemented so)",
}


def secure_aggregation_problem(strategy) -> str:
    """Why ``strategy`` cannot run under secure aggregation, or ``""`` when it can.

    Args:
        strategy: a :class:`~fedlearn_edu.strategies.Strategy`.

    Returns:
        The reason (empty when ``strategy.needs.sums_only``).

    Raises:
        TypeError: ``strategy`` is not a strategy object (a name such as ``"fedavg"``, a class, ``None``).
    """
    needs = getattr(strategy, "needs", None)
    if isinstance(strategy, (str, type)) or needs is None or not hasattr(needs, "sums_only"):
        raise TypeError(
            f"strategy must be a Strategy object (e.g. FedAvg(), or strategies.STRATEGIES[name]()), got {strategy!r}."
        )
    if needs.sums_only:
        return ""
    if needs.server_model == "none":
        return "it has no server aggregation to protect (each client keeps or mixes its own model)"
    key = getattr(type(strategy), "name", type(strategy).__name__)  # the registered name, not "ditto+craft"
    base = strategy.base if isinstance(strategy, Wrapper) else None
    if base is not None and replace(needs, personal=False) == replace(base.needs, personal=False):
        return secure_aggregation_problem(base)  # a wrapper that keeps its base's server step (Ditto)
    why = NEEDS_EACH.get(key, "its server step reads each client's update, not only their sum")
    if base is not None:
        why += f" (over {getattr(base, 'name', type(base).__name__)})"
    return f"the server needs {why}" if not why.startswith("it") else why


def check_secure_aggregation(strategy) -> None:
    """Refuse a strategy whose server step needs more than sums (``simulate(..., secure_aggregation=True)``).

    Args:
        strategy: the run's strategy.

    Raises:
        ValueError: the strategy needs each client's update or signal; the message says what.
    """
    why = secure_aggregation_problem(strategy)
    if why:
        name = getattr(strategy, "name", type(strategy).__name__)
        raise ValueError(f"{name} cannot run under secure aggregation (the server sees only sums): {why}.")

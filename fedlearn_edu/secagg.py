"""A simulation of pairwise-masked secure aggregation (Bonawitz et al., CCS 2017), and which strategies survive it.

The clients' inputs ``x_i`` (``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``) are encoded in
fixed point modulo ``2^k`` (``round(x 2^s)``, s fractional bits). Every pair of clients
(i, j) shares a seed ``s_ij`` (in the protocol: from a Diffie-Hellman key agreement; here
derived from a session seed), and client i sends

    ``y_i = x_i + sum_{j > i} PRG(s_ij) - sum_{j < i} PRG(s_ji)  (mod 2^k)``.

Every mask appears once with ``+`` and once with ``-``, so ``sum_i y_i = sum_i x_i (mod 2^k)``:
the server learns the sum (exactly, in fixed point: the sum of the rounded inputs, when
``|sum| < 2^(k-1-s)``) and, from a strict subset of the ``y_i``, nothing -- each such ``y_i`` is
uniform modulo ``2^k`` whatever ``x_i``. *Dropouts* (not simulated): if client j drops after
the masks are fixed, its pairwise masks do not cancel; in the protocol every client has
Shamir-shared its seeds with the others beforehand, and any t survivors' shares let the
server rebuild j's masks and remove them (Bonawitz et al.; SecAgg+, Bell et al. 2020, uses a
sparse graph of pairs).

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

import torch
from torch import Tensor

from .checks import Updates, check_int, check_seed, check_updates
from .utils import derive_seed

__all__ = [
    "encode",
    "decode",
    "pairwise_masks",
    "mask_inputs",
    "secure_sum",
    "NEEDS_EACH",
    "secure_aggregation_problem",
    "check_secure_aggregation",
]

_TAG_PAIR = 0x5EC466


def _check_bits(scale_bits, modulus_bits) -> tuple[int, int]:
    k = check_int(modulus_bits, "modulus_bits", 8, 62)
    s = check_int(scale_bits, "scale_bits", 0, k - 2)
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
        ValueError: ``|x| 2^s`` does not fit in ``2^(k-1)`` (it would wrap around).
    """
    s, k = _check_bits(scale_bits, modulus_bits)
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
    """
    s, k = _check_bits(scale_bits, modulus_bits)
    y = torch.remainder(y, 2**k)
    signed = torch.where(y >= 2 ** (k - 1), y - 2**k, y)
    return signed.double() / 2.0**s


def pairwise_masks(client_ids: Tensor, shape: tuple, seed: int, modulus_bits: int = 48) -> Tensor:
    """Each client's total mask ``sum_{j > i} PRG(s_ij) - sum_{j < i} PRG(s_ji)  (mod 2^k)``.

    Args:
        client_ids: ``Tensor[m]`` the participating clients' ids (their order is the protocol's).
        shape: the shape of one client's input.
        seed: the session seed the pair seeds ``s_ij = derive_seed(seed, i, j)`` come from.
        modulus_bits: k.

    Returns:
        ``Tensor[m, *shape]`` int64 in ``[0, 2^k)``; the rows sum to 0 modulo ``2^k``.
    """
    k = check_int(modulus_bits, "modulus_bits", 8, 62)
    seed = check_seed(seed)
    ids = [int(i) for i in client_ids.tolist()]
    m = len(ids)
    out = torch.zeros((m, *shape), dtype=torch.int64)
    for a in range(m):
        for b in range(a + 1, m):
            i, j = sorted((ids[a], ids[b]))
            g = torch.Generator().manual_seed(derive_seed(seed, i, j, _TAG_PAIR))
            prg = torch.randint(0, 2**k, tuple(shape), generator=g, dtype=torch.int64)
            out[a] = torch.remainder(out[a] + prg, 2**k)
            out[b] = torch.remainder(out[b] - prg, 2**k)
    return out


def mask_inputs(encoded: Tensor, client_ids: Tensor, seed: int, modulus_bits: int = 48) -> Tensor:
    """What the clients send: ``y_i = encoded_i + mask_i (mod 2^k)``.

    Args:
        encoded: ``Tensor[m, ...]`` int64, the clients' encoded inputs.
        client_ids: ``Tensor[m]``.
        seed: the session seed.
        modulus_bits: k.

    Returns:
        ``Tensor[m, ...]`` int64 in ``[0, 2^k)``.
    """
    masks = pairwise_masks(client_ids, tuple(encoded.shape[1:]), seed, modulus_bits)
    return torch.remainder(encoded.cpu() + masks, 2**modulus_bits)


def secure_sum(
    inputs: Updates, client_ids: Tensor, seed: int, scale_bits: int = 16, modulus_bits: int = 48
) -> tuple[Updates, Updates]:
    """The server's view of one round: the masked inputs, and the sum it decodes from them.

    Args:
        inputs: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}`` the clients' vectors.
        client_ids: ``Tensor[m]``.
        seed: the session seed.
        scale_bits: s.
        modulus_bits: k.

    Returns:
        ``(total, masked)``: the decoded sum (float64, the inputs' structure without the client
        axis; equal to the sum of the fixed-point-rounded inputs) and the masked inputs ``y_i``
        (int64, with the client axis).
    """
    check_updates(inputs, "inputs")
    s, k = _check_bits(scale_bits, modulus_bits)

    def one(x: Tensor, salt: int) -> tuple[Tensor, Tensor]:
        y = mask_inputs(encode(x, s, k), client_ids, derive_seed(seed, salt), k)
        return decode(torch.remainder(y.sum(0), 2**k), s, k), y

    if isinstance(inputs, Tensor):
        return one(inputs, 0)
    pairs = {name: one(x, i) for i, (name, x) in enumerate(inputs.items())}
    return {n: p[0] for n, p in pairs.items()}, {n: p[1] for n, p in pairs.items()}


# What each strategy that is not sums-only needs from every client, and what could replace it.
NEEDS_EACH = {
    "fedvg": "each client's model theta_i, to evaluate its validation gradient on the server (would need the "
    "clients to compute their weights' inputs, or a secure evaluation)",
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
    """
    needs = strategy.needs
    if needs.sums_only:
        return ""
    if needs.server_model == "none":
        return "it has no server aggregation to protect (each client keeps or mixes its own model)"
    name = getattr(strategy, "name", type(strategy).__name__)
    base = getattr(strategy, "base", None)
    key = "fedvg" if name.startswith("fedvg") else name
    if base is not None and key != "fedvg" and base.needs == needs:
        return secure_aggregation_problem(base)  # Ditto: the base's server step
    why = NEEDS_EACH.get(key, "its server step reads each client's update, not only their sum")
    if base is not None and key == "fedvg":
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

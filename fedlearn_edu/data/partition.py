"""Ways to split one dataset over many clients.

Every function here returns a *partition*: ``list[np.ndarray]`` with one int64
index array per client. Together the arrays hold every index ``0..n-1``
exactly once; each array is sorted in increasing order. All functions take a
``seed`` and are deterministic given it. Feed the result to
:func:`fedlearn_edu.data.make_federation`.

=====================================  =============================================
function                               heterogeneity it creates
=====================================  =============================================
:func:`iid_partition`                  none (equal-size random split)
:func:`dirichlet_partition`            label skew, strength set by ``alpha``
:func:`shard_partition`                pathological label skew (few classes/client)
:func:`quantity_skew_partition`        unequal client sizes, IID labels
=====================================  =============================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import as_labels, check_bool, check_int, check_positive, check_seed

__all__ = [
    "iid_partition",
    "dirichlet_partition",
    "shard_partition",
    "quantity_skew_partition",
    "partition_label_counts",
    "PartitionScheme",
    "PARTITIONS",
]


def _num_samples(num_samples_or_labels: Any, name: str) -> int:
    """An int n, or the length of an array-like of labels; ``name`` is the argument's name."""
    if isinstance(num_samples_or_labels, (int, np.integer)) and not isinstance(num_samples_or_labels, bool):
        n = check_int(num_samples_or_labels, name, 1)
        if n > np.iinfo(np.int64).max:
            raise ValueError(f"{name}={n} is larger than any index array can hold.")
        return n
    if hasattr(num_samples_or_labels, "shape") or isinstance(num_samples_or_labels, (list, tuple)):
        return int(as_labels(num_samples_or_labels, name).shape[0])
    raise TypeError(
        f"{name} must be the number of samples (int) or an array of labels, got {type(num_samples_or_labels).__name__}."
    )


def _check_enough(n: int, num_clients: int, min_size: int) -> None:
    if num_clients * min_size > n:
        most_clients = n // min_size if min_size > 0 else n
        raise ValueError(
            f"Impossible request: {num_clients} clients x min_size {min_size} = "
            f"{num_clients * min_size} samples, but the dataset has only {n}. "
            f"Use min_size <= {n // num_clients} or at most {most_clients} clients."
        )


def _sorted_parts(parts) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def partition_label_counts(labels: Any, partition, num_classes: int | None = None) -> np.ndarray:
    """How many samples of each class every client of a partition holds.

    Args:
        labels: Integer class ids of the partitioned dataset.
        partition: One index array per client.
        num_classes: Number of classes (default ``labels.max() + 1``).

    Returns:
        counts (ndarray of shape (num_clients, num_classes), int64)

    Example:
        >>> y = np.array([0, 0, 1, 1])
        >>> partition_label_counts(y, [np.array([0, 1]), np.array([2, 3])])
        array([[2, 0],
               [0, 2]])
    """
    y = as_labels(labels)
    c = int(y.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes", 1)
    if c <= int(y.max()):
        raise ValueError(f"num_classes={c} but labels holds class {int(y.max())}.")
    if isinstance(partition, (str, bytes)) or not hasattr(partition, "__iter__") or getattr(partition, "ndim", 1) == 0:
        raise TypeError(f"partition must be a list of index arrays (one per client), got {type(partition).__name__}.")
    parts = []
    for i, idx in enumerate(partition):
        arr = np.asarray(idx, dtype=object if isinstance(idx, (str, bytes)) else None)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu") or isinstance(idx, (str, bytes)):
            raise TypeError(f"partition[{i}] must be a 1-D array of integer indices, got {idx!r:.40}.")
        if arr.size and (arr.min() < 0 or arr.max() >= y.size):
            raise ValueError(f"partition[{i}] holds indices outside [0, {y.size - 1}] (labels holds {y.size}).")
        parts.append(arr.astype(np.int64))
    try:
        out = np.zeros((len(parts), c), dtype=np.int64)
    except (ValueError, MemoryError):
        raise ValueError(f"num_classes={c} is too large to count.") from None
    for i, idx in enumerate(parts):
        out[i] = np.bincount(y[idx], minlength=c)[:c]
    return out


# --------------------------------------------------------------------------- #
# IID
# --------------------------------------------------------------------------- #
def iid_partition(num_samples_or_labels: Any, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Shuffle, then cut into ``num_clients`` near-equal parts (sizes differ by at most 1).

    Args:
        num_samples_or_labels: The number of samples n, or the labels (only their count is used).
        num_clients: Number of clients K, ``1 <= K <= n``.
        seed: Seed of the shuffle. (default 0)

    Returns:
        partition (list of K int64 ndarrays): Client k holds ``n // K`` or ``n // K + 1`` indices, sorted.

    Example:
        >>> parts = iid_partition(10, 3, seed=0)
        >>> [len(p) for p in parts]
        [4, 3, 3]
    """
    n = _num_samples(num_samples_or_labels, "num_samples_or_labels")
    k = check_int(num_clients, "num_clients", 1)
    if k > n:
        raise ValueError(f"num_clients={k} exceeds the number of samples n={n}; some clients would be empty.")
    rng = np.random.default_rng(check_seed(seed))
    return _sorted_parts(np.array_split(rng.permutation(n), k))


# --------------------------------------------------------------------------- #
# Dirichlet label skew
# --------------------------------------------------------------------------- #
def _dirichlet_counts(
    class_sizes: np.ndarray, num_clients: int, alpha: float, balance: bool, rng: np.random.Generator
) -> np.ndarray:
    """One draw: ``counts[k, c]`` = samples of class c that client k receives."""
    n = int(class_sizes.sum())
    counts = np.zeros((num_clients, class_sizes.size), dtype=np.int64)
    sizes = np.zeros(num_clients, dtype=np.int64)
    cap = n / num_clients
    for c in rng.permutation(class_sizes.size):
        p = rng.dirichlet(np.full(num_clients, alpha))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # numerical safety net; not expected
            p = np.zeros(num_clients)
            p[rng.integers(num_clients)] = 1.0
        if balance:
            open_ = sizes < cap
            p = p * open_
            if p.sum() <= 0:
                # Every open client drew (numerically) zero: at such a tiny alpha the
                # Dirichlet is one-hot, so give the class to one open client at random.
                p = np.zeros(num_clients)
                p[rng.choice(np.flatnonzero(open_))] = 1.0
            p = p / p.sum()
        cuts = np.floor(np.cumsum(p) * class_sizes[c]).astype(np.int64)
        cuts[-1] = class_sizes[c]
        cuts = np.minimum(np.maximum.accumulate(cuts), class_sizes[c])
        counts[:, c] = np.diff(cuts, prepend=0)
        sizes += counts[:, c]
    return counts


def _repair_min_size(counts: np.ndarray, min_size: int) -> np.ndarray:
    """Move the fewest samples needed so every client has ``min_size``.

    Receivers are served from the currently largest client. The class moved is
    the receiver's own strongest class if the donor holds it, else the donor's
    largest class, so a repaired client is still dominated by few classes.
    """
    counts = counts.copy()
    sizes = counts.sum(axis=1)
    for r in np.argsort(sizes, kind="stable"):
        while sizes[r] < min_size:
            d = int(np.argmax(sizes))
            if sizes[d] <= min_size:  # cannot happen when K * min_size <= n
                raise RuntimeError("Internal error: no donor client above min_size.")
            shared = counts[r] * (counts[d] > 0)
            c = int(np.argmax(shared)) if shared.max() > 0 else int(np.argmax(counts[d]))
            m = int(min(min_size - sizes[r], sizes[d] - min_size, counts[d, c]))
            counts[d, c] -= m
            counts[r, c] += m
            sizes[d] -= m
            sizes[r] += m
    return counts


def dirichlet_partition(
    labels: Any,
    num_clients: int,
    alpha: float,
    min_size: int = 10,
    seed: int = 0,
    max_tries: int = 100,
    balance: bool = True,
    repair: bool = True,
) -> list[np.ndarray]:
    r"""Label-skewed split: each class is spread over the clients with Dirichlet proportions.

    For every class c (in a random order) draw ``p ~ Dir(alpha * 1_K)`` and give
    client k the share ``p_k`` of class c's samples. Small ``alpha`` (0.01-0.1)
    concentrates each class on a few clients; large ``alpha`` (100) is close to
    IID. The whole draw is repeated, at most ``max_tries`` times, until every
    client holds at least ``min_size`` samples.

    Two details make small ``alpha`` workable (both are common practice, e.g.
    the NIID-Bench code that many papers, CRAFT included, build on):

    * ``balance=True``: a client that already holds ``>= n / K`` samples gets
      share 0 of the classes still to be dealt (its ``p_k`` is zeroed and
      ``p`` renormalised). Without it, at ``alpha = 0.01`` a handful of clients
      would receive everything.
    * ``repair=True``: if no draw in ``max_tries`` reaches ``min_size`` (typical
      when ``alpha`` is tiny and ``K`` large: a class of 180 digits goes almost
      entirely to one client), the draw with the smallest total shortfall is
      repaired: each client below ``min_size`` receives the missing samples
      from the currently largest client, taking the class it already holds
      most of (else the donor's largest class). Only the shortfall moves, so
      the label skew is kept. With ``repair=False`` a clear ``ValueError``
      is raised instead.

    Args:
        labels: Integer class ids (ndarray, list or Tensor).
        num_clients: Number of clients K >= 1.
        alpha: Dirichlet concentration, > 0. Smaller means more skew.
        min_size: Least number of samples per client. ``K * min_size > n`` raises ``ValueError`` at once.
            (default 10)
        seed: Seed of every random choice. (default 0)
        max_tries: Bound on the number of Dirichlet draws; the function never loops longer. (default 100)
        balance: Zero the share of clients already above ``n / K`` (see above). (default True)
        repair: Repair the best draw instead of raising when no draw meets ``min_size``. (default True)

    Returns:
        partition (list of K int64 ndarrays): Sorted indices of each client; every index ``0..n-1`` appears
            once.

    Raises:
        ValueError: Bad arguments, an impossible ``min_size``, or (``repair=False``) no draw meeting
            ``min_size`` within ``max_tries``.

    Example:
        >>> y = np.repeat(np.arange(10), 100)
        >>> parts = dirichlet_partition(y, num_clients=20, alpha=0.1, min_size=10, seed=0)
        >>> len(parts), sum(len(p) for p in parts), min(len(p) for p in parts) >= 10
        (20, 1000, True)
    """
    balance = check_bool(balance, "balance")
    repair = check_bool(repair, "repair")
    y = as_labels(labels)
    k = check_int(num_clients, "num_clients", 1)
    alpha = check_positive(alpha, "alpha")
    min_size = check_int(min_size, "min_size", 0)
    max_tries = check_int(max_tries, "max_tries", 1)
    n = y.size
    _check_enough(n, k, min_size)

    rng = np.random.default_rng(check_seed(seed))
    classes, y_inv = np.unique(y, return_inverse=True)
    class_idx = [rng.permutation(np.flatnonzero(y_inv == c)) for c in range(classes.size)]
    class_sizes = np.array([len(ix) for ix in class_idx], dtype=np.int64)

    best, best_short, best_min = None, None, None
    for _ in range(max_tries):
        counts = _dirichlet_counts(class_sizes, k, alpha, balance, rng)
        sizes = counts.sum(axis=1)
        short = int(np.maximum(min_size - sizes, 0).sum())
        if best is None or short < best_short:
            best, best_short, best_min = counts, short, int(sizes.min())
        if short == 0:
            break
    if best_short > 0:
        if not repair:
            raise ValueError(
                f"dirichlet_partition: none of {max_tries} Dirichlet draws (alpha={alpha}, "
                f"{k} clients, {n} samples) gave every client >= min_size={min_size} samples; "
                f"the best draw's smallest client had {best_min}. Lower min_size, use fewer "
                f"clients, use a larger alpha, raise max_tries, or pass repair=True."
            )
        best = _repair_min_size(best, min_size)

    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, ix in enumerate(class_idx):
        for client, chunk in enumerate(np.split(ix, np.cumsum(best[:, c])[:-1])):
            if chunk.size:
                parts[client].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


# --------------------------------------------------------------------------- #
# shards
# --------------------------------------------------------------------------- #
def shard_partition(labels: Any, num_clients: int, shards_per_client: int = 2, seed: int = 0) -> list[np.ndarray]:
    """Pathological label skew (McMahan et al., 2017): sort by label, cut into shards, deal.

    The samples are sorted by label (ties in random order), cut into
    ``num_clients * shards_per_client`` contiguous shards of near-equal size,
    and every client receives ``shards_per_client`` shards chosen at random.
    A shard straddles a class boundary only when class sizes are not multiples
    of the shard size, so a client typically sees ``shards_per_client`` classes
    (at most ``2 * shards_per_client``).

    Args:
        labels: Integer class ids.
        num_clients: Number of clients K >= 1.
        shards_per_client: Shards per client s >= 1; needs ``K * s <= n``. (default 2)
        seed: Seed of the tie order and of the dealing. (default 0)

    Returns:
        partition (list of K int64 ndarrays)

    Example:
        >>> y = np.repeat(np.arange(10), 20)
        >>> parts = shard_partition(y, num_clients=10, shards_per_client=2, seed=0)
        >>> max(len(np.unique(y[p])) for p in parts) <= 2
        True
    """
    y = as_labels(labels)
    k = check_int(num_clients, "num_clients", 1)
    s = check_int(shards_per_client, "shards_per_client", 1)
    n = y.size
    if k * s > n:
        raise ValueError(
            f"num_clients={k} x shards_per_client={s} = {k * s} shards, but labels holds only {n} samples. "
            "Use fewer clients or fewer shards per client."
        )
    rng = np.random.default_rng(check_seed(seed))
    perm = rng.permutation(n)
    order = perm[np.argsort(y[perm], kind="stable")]
    shards = np.array_split(order, k * s)
    deal = rng.permutation(k * s)
    return _sorted_parts(np.concatenate([shards[j] for j in deal[i * s : (i + 1) * s]]) for i in range(k))


# --------------------------------------------------------------------------- #
# quantity skew
# --------------------------------------------------------------------------- #
def quantity_skew_partition(
    num_samples: Any, num_clients: int, sigma: float = 1.0, min_size: int = 10, seed: int = 0
) -> list[np.ndarray]:
    r"""Unequal client sizes with IID labels.

    Sizes: every client first gets ``min_size`` samples; the remaining
    ``R = n - K * min_size`` are shared in proportion to log-normal weights

    .. math:: w_k \sim \mathrm{LogNormal}(0, \sigma^2),\qquad
              n_k = \text{min\_size} + \operatorname{round}\!\Big(R\,\frac{w_k}{\sum_j w_j}\Big)

    (largest-remainder rounding, so the sizes add up to n exactly). ``sigma=0``
    gives equal sizes; ``sigma=1`` already makes the largest client several
    times the median; ``sigma=2`` is extreme. The samples themselves are a
    random permutation, so labels are IID.

    Args:
        num_samples: n, or the labels (only their count is used).
        num_clients: Number of clients K >= 1.
        sigma: Standard deviation of ``log w_k``, >= 0. (default 1.0)
        min_size: Least samples per client; ``K * min_size <= n`` is required. (default 10)
        seed: seed of the random choices (default 0).

    Returns:
        partition (list of K int64 ndarrays)

    Example:
        >>> parts = quantity_skew_partition(1000, num_clients=10, sigma=1.0, min_size=10, seed=0)
        >>> sum(len(p) for p in parts), min(len(p) for p in parts) >= 10
        (1000, True)
    """
    n = _num_samples(num_samples, "num_samples")
    k = check_int(num_clients, "num_clients", 1)
    sigma = check_positive(sigma, "sigma", allow_zero=True)
    min_size = check_int(min_size, "min_size", 0)
    _check_enough(n, k, min_size)
    if k > n:
        raise ValueError(f"num_clients={k} exceeds the number of samples n={n}; some clients would be empty.")
    rng = np.random.default_rng(check_seed(seed))
    # w_k = exp(z_k), z_k ~ N(0, sigma^2) (what rng.lognormal draws), normalised through the
    # largest z: exp(z) itself overflows to inf for a large sigma (1000) and inf / inf is NaN.
    z = rng.normal(0.0, sigma, size=k)
    w = np.exp(z - z.max())
    w = w / w.sum()
    rest = n - k * min_size
    raw = w * rest
    base = np.floor(raw).astype(np.int64)
    left = rest - int(base.sum())
    if left > 0:
        base[np.argsort(-(raw - base), kind="stable")[:left]] += 1
    sizes = min_size + base
    if min_size == 0 and np.any(sizes == 0):
        # keep every client non-empty when possible: take one sample from the largest
        for i in np.flatnonzero(sizes == 0):
            j = int(np.argmax(sizes))
            sizes[j] -= 1
            sizes[i] += 1
    perm = rng.permutation(n)
    return _sorted_parts(np.split(perm, np.cumsum(sizes)[:-1]))


# --------------------------------------------------------------------------- #
# the registry that federated_dataset and the command line read
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class PartitionScheme:
    """A partition function with the options it reads and a short description.

    Attributes:
        function: ``function(labels, num_clients, *, seed, **options) -> partition``.
        options: names of the keyword options it takes (e.g. ``("alpha", "min_size")``).
        describe: ``describe(options) -> str``, e.g. ``"Dirichlet alpha=0.1"``.
    """

    function: Callable[..., list[np.ndarray]]
    options: tuple[str, ...]
    describe: Callable[[dict], str]

    def __call__(self, labels: Any, num_clients: int, seed: int = 0, **options) -> list[np.ndarray]:
        """Partition ``labels`` over ``num_clients`` clients, taking from ``options`` only what applies."""
        return self.function(labels, num_clients, seed=seed, **{k: options[k] for k in self.options if k in options})


PARTITIONS: dict[str, PartitionScheme] = {
    "iid": PartitionScheme(iid_partition, (), lambda o: "IID"),
    "dirichlet": PartitionScheme(
        dirichlet_partition, ("alpha", "min_size"), lambda o: f"Dirichlet alpha={float(o['alpha']):g}"
    ),
    "shards": PartitionScheme(
        shard_partition, ("shards_per_client",), lambda o: f"{o['shards_per_client']} shards/client"
    ),
    "quantity": PartitionScheme(
        quantity_skew_partition, ("sigma", "min_size"), lambda o: f"quantity skew sigma={float(o['sigma']):g}"
    ),
}

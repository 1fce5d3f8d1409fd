"""Label noise: flipped labels and noisy clients.

The FedOUI chapter's "noisy clients" setting: a few clients have a fraction of
their training labels flipped uniformly to *another* class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..checks import as_labels, check_bool, check_int, check_range
from .federation import ClientData, Federation

__all__ = ["flip_labels", "add_label_noise", "reverse_labels"]


def flip_labels(labels: Any, fraction: float, num_classes: int, seed: int = 0, return_mask: bool = False):
    """Flip a fraction of labels, each uniformly to one of the *other* classes.

    Exactly ``round(fraction * n)`` positions, chosen without replacement, get
    the label ``(y + r) mod C`` with ``r`` uniform on ``1..C-1``: uniform over
    the ``C - 1`` wrong classes, never the true one.

    Args:
        labels: Integer class ids in ``[0, num_classes)``.
        fraction: Share of labels to flip, in ``[0, 1]``.
        num_classes: Number of classes C >= 2.
        seed: seed of the random choices (default 0).
        return_mask: Also return the boolean mask of flipped positions. (default False)

    Returns:
        ``noisy``: a new int64 ``ndarray[n]`` (a Tensor on the same device if ``labels`` is
        one); ``labels`` is not modified. With ``return_mask``, ``(noisy, mask)`` where
        ``mask`` is a bool ``ndarray[n]``, True where the label was flipped.

    Example:
        >>> y = np.zeros(10, dtype=np.int64)
        >>> noisy = flip_labels(y, 0.4, num_classes=3, seed=0)
        >>> int((noisy != y).sum())
        4
    """
    return_mask = check_bool(return_mask, "return_mask")
    is_tensor = isinstance(labels, torch.Tensor)
    y = as_labels(labels).copy()
    fraction = check_range(fraction, "fraction", 0, 1)
    c = check_int(num_classes, "num_classes", 2)
    if y.max() >= c:
        raise ValueError(f"labels must be < num_classes={c}, found {int(y.max())}.")
    rng = np.random.default_rng(seed)
    n = y.size
    n_flip = int(round(fraction * n))
    idx = rng.choice(n, size=n_flip, replace=False)
    y[idx] = (y[idx] + rng.integers(1, c, size=n_flip)) % c
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    out: Any = torch.as_tensor(y, device=labels.device) if is_tensor else y
    return (out, mask) if return_mask else out


def add_label_noise(
    federation: Federation, noisy_clients: int | Sequence[int], fraction: float, seed: int = 0
) -> Federation:
    """A copy of ``federation`` where some clients' *training* labels are flipped.

    Local test labels stay clean, so a client's test accuracy still measures
    the true task. Every client's ``info`` gets ``"noisy"`` (bool) and
    ``"num_flipped"`` (int).

    Args:
        federation: the clients.
        noisy_clients: How many clients to corrupt (chosen at random), or their ids.
        fraction: Share of each noisy client's training labels to flip, in ``[0, 1]``.
        seed: seed of the random choices (default 0).

    Returns:
        A :class:`Federation`; inputs are shared with ``federation``, label tensors are new.

    Example:
        >>> import torch
        >>> from fedlearn_edu.data import make_federation
        >>> x, y = torch.rand(200, 1, 8, 8), torch.arange(200) % 10
        >>> fed = make_federation(x, y, np.array_split(np.arange(200), 5))
        >>> noisy = add_label_noise(fed, noisy_clients=2, fraction=0.4, seed=0)
        >>> sum(c.info["noisy"] for c in noisy)
        2
    """
    k = federation.num_clients
    rng = np.random.default_rng(seed)
    if isinstance(noisy_clients, (int, np.integer)) and not isinstance(noisy_clients, bool):
        m = check_int(noisy_clients, "noisy_clients", 0)
        if m > k:
            raise ValueError(f"noisy_clients={m} exceeds the number of clients ({k}).")
        chosen = set(rng.choice(k, size=m, replace=False).tolist())
    else:
        chosen = {check_int(i, "client id", 0) for i in noisy_clients}
        bad = [i for i in chosen if i >= k]
        if bad:
            raise ValueError(f"Client ids {sorted(bad)} out of range for {k} clients.")
    clients = []
    for i, c in enumerate(federation.clients):
        info = dict(c.info)
        train_y = c.train_y
        flipped = 0
        if i in chosen and c.num_train > 0:
            train_y, mask = flip_labels(
                c.train_y, fraction, federation.num_classes, seed=int(rng.integers(2**31)), return_mask=True
            )
            flipped = int(mask.sum())
        info.update(noisy=i in chosen, num_flipped=flipped)
        clients.append(ClientData(c.train_x, train_y, c.test_x, c.test_y, info))
    return Federation(clients, federation.num_classes, federation.name)


def reverse_labels(federation: Federation, clients: Sequence[int]) -> Federation:
    """A copy of ``federation`` where the given clients' *training* labels are reversed: ``y -> C - 1 - y``.

    The label-flipping attack (every label of an attacker, deterministically); test labels stay
    clean. Every client's ``info`` gets ``"attacker"`` (bool). Works on any partition.

    Args:
        federation: the clients.
        clients: the attackers' ids.

    Returns:
        A :class:`Federation`; inputs are shared with ``federation``, the attackers' label tensors are new.

    Raises:
        ValueError: an id out of range.

    Example:
        >>> import torch
        >>> from fedlearn_edu.data import make_federation
        >>> x, y = torch.rand(40, 1, 8, 8), torch.arange(40) % 10
        >>> fed = make_federation(x, y, np.array_split(np.arange(40), 4))
        >>> flipped = reverse_labels(fed, [1])
        >>> bool((flipped[1].train_y == 9 - fed[1].train_y).all()), torch.equal(flipped[0].train_y, fed[0].train_y)
        (True, True)
    """
    k = federation.num_clients
    chosen = {check_int(i, "client id", 0) for i in clients}
    bad = sorted(i for i in chosen if i >= k)
    if bad:
        raise ValueError(f"Client ids {bad} out of range for {k} clients.")
    c_minus_1 = federation.num_classes - 1
    out = []
    for i, c in enumerate(federation.clients):
        train_y = c_minus_1 - c.train_y if i in chosen else c.train_y
        out.append(ClientData(c.train_x, train_y, c.test_x, c.test_y, {**c.info, "attacker": i in chosen}))
    return Federation(out, federation.num_classes, federation.name)

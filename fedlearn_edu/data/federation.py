"""Clients and their local train/test splits.

A :class:`Federation` is the one object the simulator needs from the data
layer: a list of :class:`ClientData`, each holding its own local training and
local test tensors. Build one from a dataset and a partition (one index array
per client) with :func:`make_federation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..checks import as_labels, check_int, check_range, check_seed

__all__ = ["ClientData", "Federation", "make_federation"]


@dataclass
class ClientData:
    """One client's data.

    Attributes:
        train_x: ``Tensor[n_train, *input_shape]`` float32 inputs used for local training.
        train_y: ``Tensor[n_train]`` int64 labels.
        test_x: ``Tensor[n_test, *input_shape]`` the client's held-out split; the
            global model's per-client accuracy is measured here.
        test_y: ``Tensor[n_test]`` int64 labels.
        info: free-form facts about the client (e.g. ``{"cluster": 2, "noisy": True}``).
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if not isinstance(x, Tensor) or not isinstance(y, Tensor):
                raise TypeError(
                    f"{split}_x and {split}_y must be torch Tensors, got {type(x).__name__}, {type(y).__name__}."
                )
            if y.dim() != 1 or x.dim() < 1 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"{split}_x {tuple(x.shape)} and {split}_y {tuple(y.shape)} must hold one label per input "
                    "([n, ...] and [n])."
                )
            if y.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
                raise TypeError(f"{split}_y must hold integer class ids (int64), got {y.dtype}.")
            if y.numel() and int(y.min()) < 0:
                raise ValueError(f"{split}_y holds a negative label ({int(y.min())}).")
            if not x.is_floating_point():
                raise TypeError(f"{split}_x must be floating point (e.g. float32 in [0, 1]), got {x.dtype}.")
            if x.device.type != "meta" and not bool(torch.isfinite(x).all()):
                raise ValueError(f"{split}_x holds NaN or Inf; clean the inputs before building the client.")
        if self.train_x.shape[1:] != self.test_x.shape[1:] and self.test_x.shape[0] > 0:
            raise ValueError(
                f"train_x and test_x must share one input shape; got {tuple(self.train_x.shape[1:])} and "
                f"{tuple(self.test_x.shape[1:])}."
            )

    @property
    def num_train(self) -> int:
        """Number of local training samples."""
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        """Number of local test samples."""
        return int(self.test_y.shape[0])

    def to(self, device) -> ClientData:
        """A copy with the four tensors on ``device`` (and a copy of ``info``).

        Args:
            device: a ``torch.device`` or its name.

        Returns:
            A new :class:`ClientData`.
        """
        return ClientData(
            self.train_x.to(device),
            self.train_y.to(device),
            self.test_x.to(device),
            self.test_y.to(device),
            dict(self.info),
        )


@dataclass
class Federation:
    """A set of clients sharing one label space.

    Attributes:
        clients: the clients, indexed 0..N-1.
        num_classes: number of classes of the label space.
        name: a short description used in plots and tables.
    """

    clients: list[ClientData]
    num_classes: int
    name: str = ""

    def __post_init__(self) -> None:
        self.num_classes = check_int(self.num_classes, "num_classes", 1)
        if not all(isinstance(c, ClientData) for c in self.clients):
            raise TypeError("clients must be a list of ClientData.")
        if len(self.clients) == 0:
            raise ValueError("A Federation needs at least one client; got an empty list.")
        shapes = {tuple(c.train_x.shape[1:]) for c in self.clients} | {
            tuple(c.test_x.shape[1:]) for c in self.clients if c.num_test
        }
        if len(shapes) != 1:
            raise ValueError(f"All clients must share one input shape; found {sorted(shapes)}.")
        for i, c in enumerate(self.clients):
            if c.num_train == 0:
                raise ValueError(
                    f"Client {i} has no training samples. Use a partition with min_size >= 2 "
                    "or drop empty clients before building the Federation."
                )
            for split, y in (("train", c.train_y), ("test", c.test_y)):
                if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                    raise ValueError(f"Client {i} has {split} labels outside [0, {self.num_classes - 1}].")

    def __len__(self) -> int:
        return len(self.clients)

    def __getitem__(self, i: int) -> ClientData:
        return self.clients[i]

    def __iter__(self):
        return iter(self.clients)

    @property
    def num_clients(self) -> int:
        """N, the number of clients."""
        return len(self.clients)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, e.g. ``(1, 8, 8)`` for digits."""
        return tuple(self.clients[0].train_x.shape[1:])

    @property
    def num_train_samples(self) -> Tensor:
        """``Tensor[N]`` (int64) training-set size n_i of every client."""
        return torch.tensor([c.num_train for c in self.clients], dtype=torch.int64)

    @property
    def num_test_samples(self) -> Tensor:
        """``Tensor[N]`` (int64) local test-set size of every client."""
        return torch.tensor([c.num_test for c in self.clients], dtype=torch.int64)

    def label_counts(self, split: str = "train") -> np.ndarray:
        """``ndarray[N, num_classes]``: how many samples of each class each client holds.

        Args:
            split: ``"train"`` or ``"test"``.

        Returns:
            ``ndarray[N, num_classes]`` of int64 counts.
        """
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}.")
        counts = np.zeros((len(self), self.num_classes), dtype=np.int64)
        for i, c in enumerate(self.clients):
            ys = []
            if split in ("train", "all"):
                ys.append(c.train_y)
            if split in ("test", "all"):
                ys.append(c.test_y)
            y = torch.cat(ys).cpu()
            counts[i] = np.bincount(y.numpy(), minlength=self.num_classes)
        return counts

    def to(self, device) -> Federation:
        """A copy with every client's tensors on ``device``.

        Args:
            device: a ``torch.device`` or its name.

        Returns:
            A new :class:`Federation`.
        """
        return Federation([c.to(device) for c in self.clients], self.num_classes, self.name)


def make_federation(
    x: Tensor,
    y: Tensor,
    partition: Sequence[np.ndarray],
    *,
    test_fraction: float = 0.2,
    num_classes: int | None = None,
    seed: int = 0,
    name: str = "",
) -> Federation:
    """Split a dataset over clients, then each client's share into local train / test.

    Args:
        x: ``Tensor[n, *input_shape]`` inputs.
        y: ``Tensor[n]`` integer labels.
        partition: one integer index array per client (as returned by the
            ``*_partition`` functions); together they index into ``x``/``y``.
        test_fraction: share of each client's samples held out as its local
            test split: ``round(test_fraction * n_i)`` samples, at least 1 and at
            most ``n_i - 1`` when ``0 < test_fraction`` and ``n_i >= 2``.
        num_classes: size of the label space (default: ``y.max() + 1``).
        seed: seed of the per-client shuffle that picks the test samples.
        name: a short description of the federation, used in plots and tables.

    Returns:
        A :class:`Federation` with ``len(partition)`` clients.

    Example:
        >>> import torch, numpy as np
        >>> x, y = torch.rand(100, 1, 8, 8), torch.arange(100) % 10
        >>> fed = make_federation(x, y, np.array_split(np.arange(100), 4))
        >>> fed.num_clients, fed[0].num_train, fed[0].num_test
        (4, 20, 5)
    """
    x = torch.as_tensor(x)
    if x.dim() < 1:
        raise ValueError("x must be Tensor[n, *input_shape], got a scalar.")
    y = torch.from_numpy(as_labels(y, "y")).to(x.device) if len(y) else torch.as_tensor(y).long()
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]} labels.")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point (e.g. float32 in [0, 1]), got {x.dtype}.")
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x.reshape(x.shape[0], -1))).any(1).sum())
        raise ValueError(f"x holds NaN or Inf in {bad} sample(s); clean the inputs first.")
    test_fraction = check_range(test_fraction, "test_fraction", 0, 1, high_open=True)
    seed = check_seed(seed)
    if len(partition) == 0:
        raise ValueError("The partition is empty: it must hold one index array per client.")
    if num_classes is None:
        num_classes = int(y.max()) + 1
    num_classes = check_int(num_classes, "num_classes", 1)
    if y.numel() and int(y.max()) >= num_classes:
        raise ValueError(f"y holds label {int(y.max())}, outside [0, {num_classes - 1}] (num_classes={num_classes}).")
    arrays = []
    for i, idx in enumerate(partition):
        idx = np.asarray(idx)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"partition[{i}] must be a 1-D array of integer indices, got {idx.dtype} {idx.shape}.")
        arrays.append(idx.astype(np.int64))
    taken = np.concatenate(arrays)
    if taken.size and (taken.min() < 0 or taken.max() >= x.shape[0]):
        i = next(j for j, a in enumerate(arrays) if a.size and (a.min() < 0 or a.max() >= x.shape[0]))
        raise ValueError(f"Client {i} has indices outside [0, {x.shape[0] - 1}].")
    if np.unique(taken).size != taken.size:
        raise ValueError("The partition's index arrays overlap: every sample may belong to one client only.")
    rng = np.random.default_rng(seed)
    clients = []
    for i, idx in enumerate(arrays):
        if idx.size == 0:
            raise ValueError(f"Client {i} received no samples; raise min_size of the partition.")
        idx = rng.permutation(idx)
        n = idx.size
        n_test = 0
        if test_fraction > 0 and n >= 2:
            n_test = int(min(max(round(test_fraction * n), 1), n - 1))
        test_idx, train_idx = torch.as_tensor(idx[:n_test]), torch.as_tensor(idx[n_test:])
        clients.append(ClientData(x[train_idx], y[train_idx], x[test_idx], y[test_idx]))
    return Federation(clients, num_classes, name)

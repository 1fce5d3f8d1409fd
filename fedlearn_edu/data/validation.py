"""Validation sets held by the server (FedVG and other server-side signals).

Two kinds, as in the FedVG paper:

* :func:`server_validation_split`: a share (~10%) of every client's training data
  pooled at the server; the clients no longer train on those samples;
* :func:`external_validation_set`: a public set from *another* source than the
  clients' data (e.g. MNIST shrunk to 8x8 for clients on scikit-learn digits, or
  digits enlarged to 28x28 for clients on MNIST), resized with
  :func:`resize_images` to the clients' input shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_int, check_range
from .datasets import random_subset
from .federation import ClientData, Federation

__all__ = ["server_validation_split", "resize_images", "external_validation_set"]


def server_validation_split(
    federation: Federation,
    fraction: float = 0.1,
    seed: int = 0,
) -> tuple[Federation, tuple[Tensor, Tensor]]:
    """Move a share of every client's *training* samples to one pooled server validation set.

    Client i gives ``round(fraction * n_i)`` of its training samples (at least 1 when
    ``fraction > 0``, always leaving it at least one), chosen at random. Local test
    splits are untouched.

    Args:
        federation: the clients.
        fraction: Share of each client's training split moved to the server, in ``[0, 1)``. (default 0.1)
        seed: seed of the random choices (default 0).

    Returns:
        ``(federation, (x_val, y_val))``: the clients without the moved samples (``info``
        gains ``"num_val"``), and the pooled validation set ``Tensor[n_val, *input_shape]``
        and ``Tensor[n_val]``.

    Call it *before* :func:`~fedlearn_edu.data.add_label_noise` to model a curated
    (clean) server set, after it to let noisy clients pass their noise to the server.

    Example:
        >>> from fedlearn_edu.data import federated_dataset
        >>> fed = federated_dataset("digits", num_clients=5, alpha=1.0, seed=0)
        >>> clients, (x_val, y_val) = server_validation_split(fed, fraction=0.1, seed=0)
        >>> int(clients.num_train_samples.sum() + y_val.shape[0]) == int(fed.num_train_samples.sum())
        True
    """
    fraction = check_range(fraction, "fraction", 0, 1, high_open=True, why="(clients must keep training data)")
    rng = np.random.default_rng(seed)
    clients, xs, ys = [], [], []
    for c in federation.clients:
        n = c.num_train
        k = 0
        if fraction > 0 and n >= 2:
            k = int(min(max(round(fraction * n), 1), n - 1))
        perm = torch.as_tensor(rng.permutation(n))
        val_idx, keep_idx = perm[:k], perm[k:].sort().values
        xs.append(c.train_x[val_idx])
        ys.append(c.train_y[val_idx])
        clients.append(
            ClientData(c.train_x[keep_idx], c.train_y[keep_idx], c.test_x, c.test_y, {**c.info, "num_val": k})
        )
    x_val, y_val = torch.cat(xs), torch.cat(ys)
    if y_val.numel() == 0:
        raise ValueError(
            "The pooled validation set is empty: raise fraction (clients need >= 2 training samples to give one away)."
        )
    return Federation(clients, federation.num_classes, federation.name), (x_val, y_val)


def resize_images(
    x: Tensor, size: int | Sequence[int], *, channels: int | None = None, crop: int = 0, pad: int = 0
) -> Tensor:
    """Resize a batch of images ``Tensor[n, C, H, W]`` to another resolution.

    Steps: drop ``crop`` pixels at every border; resize to ``size - 2 * pad`` (area
    averaging when shrinking, bilinear when enlarging); zero-pad ``pad`` pixels back;
    convert the channels (mean to go to 1 channel, repeat to go from 1 to C); clamp to [0, 1].

    Args:
        x: Tensor of shape (n, C, H, W), values in [0, 1]
        size: Output height and width.
        channels: Output channels (default: unchanged).
        crop: pixels dropped at every border first (default 0). E.g. MNIST's digits sit in a
            20x20 box inside 28x28: ``crop=4`` before shrinking to 8x8 frames them as
            scikit-learn's digits.
        pad: zero pixels added back at every border (default 0); ``pad=4`` does the reverse of
            ``crop=4`` when enlarging.

    Returns:
        ``Tensor[n, channels, *size]``.

    Example:
        >>> resize_images(torch.rand(5, 1, 28, 28), 8, crop=4).shape
        torch.Size([5, 1, 8, 8])
        >>> resize_images(torch.rand(5, 1, 8, 8), 28, pad=4, channels=3).shape
        torch.Size([5, 3, 28, 28])
    """
    if x.dim() != 4:
        raise ValueError(f"resize_images needs images shaped (n, C, H, W); got {tuple(x.shape)}.")
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    crop, pad = check_int(crop, "crop", 0), check_int(pad, "pad", 0)
    if crop:
        if 2 * crop >= min(x.shape[-2:]):
            raise ValueError(f"crop={crop} removes the whole {tuple(x.shape[-2:])} image.")
        x = x[..., crop:-crop, crop:-crop]
    inner = (h - 2 * pad, w - 2 * pad)
    if min(inner) < 1:
        raise ValueError(f"pad={pad} leaves no room in a {h}x{w} image.")
    x = x.float()
    shrink = inner[0] <= x.shape[-2] and inner[1] <= x.shape[-1]
    x = (
        F.interpolate(x, size=inner, mode="area")
        if shrink
        else F.interpolate(x, size=inner, mode="bilinear", align_corners=False)
    )
    if pad:
        x = F.pad(x, (pad, pad, pad, pad))
    if channels is not None and channels != x.shape[1]:
        if channels == 1:
            x = x.mean(dim=1, keepdim=True)
        elif x.shape[1] == 1:
            x = x.repeat(1, channels, 1, 1)
        else:
            raise ValueError(f"Cannot convert {x.shape[1]} channels to {channels}.")
    return x.clamp(0, 1)


def external_validation_set(
    name: str,
    input_shape: Sequence[int],
    num_samples: int | None = None,
    *,
    split: str = "test",
    crop: int = 0,
    pad: int = 0,
    seed: int = 0,
    root=None,
    download: bool = False,
) -> tuple[Tensor, Tensor]:
    """A validation set from another dataset, resized to the clients' ``input_shape``.

    Args:
        name: Any :func:`~fedlearn_edu.data.load_dataset` name, e.g. ``"mnist"`` or ``"digits"``.
        input_shape: The clients' input shape (``federation.input_shape``).
        num_samples: Keep a random subset of this many samples (default: all of the split).
        split: {"test", "train"}, default="test"
        crop: passed to :func:`resize_images`.
        pad: passed to :func:`resize_images`.
        seed: Seeds the subset. (default 0)
        root: passed to :func:`~fedlearn_edu.data.load_dataset`.
        download: passed to :func:`~fedlearn_edu.data.load_dataset`.

    Returns:
        ``(x, y)``: ``Tensor[n, *input_shape]`` and ``Tensor[n]``.

    Example:
        >>> x, y = external_validation_set("digits", (1, 28, 28), num_samples=100, pad=4)
        >>> x.shape, y.shape
        (torch.Size([100, 1, 28, 28]), torch.Size([100]))
    """
    from .datasets import load_dataset

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (channels, height, width); got {input_shape}.")
    train, test = load_dataset(name, root=root, download=download)
    x, y = (test if split == "test" else train).tensors
    if num_samples is not None:
        x, y = random_subset(x, y, num_samples, seed, f"of {name}'s {split} split")
    return resize_images(x, shape[1:], channels=shape[0], crop=crop, pad=pad), y.clone()

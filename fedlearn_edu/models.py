"""Teaching models: MLP, CNN, SmallCNN and ResNet-20 -- no BatchNorm anywhere.

BatchNorm's running statistics break vectorised (vmap) client training and
misbehave under non-IID averaging, so normalisation is GroupNorm. Every model
maps ``Tensor[B, *input_shape]`` to logits ``Tensor[B, num_classes]`` and, with
``features=True``, returns the penultimate layer's *pre-activations*
``Tensor[B, d]`` (the layer FedOUI reads).

Every model owns its split into a feature extractor and a fully connected head::

    model(x, features) == model.head(model.features(x), features)

``features(x)`` is ``Tensor[B, d]``, the input of the first fully connected layer
of the head, named by ``model.head_layer`` (where a client-conditional model
appends its condition, :class:`fedlearn_edu.conditional.ConditionalModel`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_int, check_seed

__all__ = ["MLP", "CNN", "SmallCNN", "ResNet20", "make_model", "MODELS", "count_parameters"]


def _check_input_shape(input_shape: Sequence[int], need_image: bool, name: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in input_shape)
    if any(s <= 0 for s in shape) or not shape:
        raise ValueError(f"{name}: input_shape must be positive sizes, got {input_shape}.")
    if need_image and len(shape) != 3:
        raise ValueError(f"{name} needs image inputs shaped (channels, height, width); got {shape}.")
    return shape


class MLP(nn.Module):
    """Multi-layer perceptron (CRAFT's MLP 200-200 by default).

    Args:
        input_shape: shape of one input, e.g. ``(1, 8, 8)`` or ``(60,)``; it is flattened.
        num_classes: number of output logits.
        hidden: sizes of the hidden layers.

    Example:
        >>> MLP((1, 8, 8), 10)(torch.zeros(4, 1, 8, 8)).shape
        torch.Size([4, 10])
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (200, 200)):
        super().__init__()
        shape = _check_input_shape(input_shape, False, "MLP")
        if not hidden:
            raise ValueError("MLP needs at least one hidden layer.")
        sizes = [math.prod(shape), *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.out = nn.Linear(sizes[-1], num_classes)

    @property
    def head_layer(self) -> str:
        """The first layer of the head: the last hidden layer (earlier layers are the features)."""
        return f"hidden.{len(self.hidden) - 1}"

    def features(self, x: Tensor) -> Tensor:
        """``Tensor[B, d]``: the activations entering the last hidden layer.

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.

        Returns:
            ``Tensor[B, d]``.
        """
        h = x.flatten(1)
        for layer in self.hidden[:-1]:
            h = F.relu(layer(h))
        return h

    def head(self, z: Tensor, features: bool = False) -> Tensor:
        """Logits from :meth:`features` (``features=True``: the last hidden pre-activations).

        Args:
            z: ``Tensor[B, d]`` from :meth:`features`.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        z = self.hidden[-1](z)
        return z if features else self.out(F.relu(z))

    def forward(self, x: Tensor, features: bool = False) -> Tensor:
        """``head(features(x))``: ``Tensor[batch, num_classes]`` logits (``features=True``: the head's features).

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        return self.head(self.features(x), features)


class CNN(nn.Module):
    """CRAFT's CNN: conv5x5(64)-pool-conv5x5(64)-pool-FC384-FC192-FC(num_classes)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int):
        super().__init__()
        c, h, w = _check_input_shape(input_shape, True, "CNN")
        self.conv1 = nn.Conv2d(c, 64, 5, padding=2)
        self.conv2 = nn.Conv2d(64, 64, 5, padding=2)
        flat = 64 * (h // 4) * (w // 4)
        if flat == 0:
            raise ValueError(f"CNN needs inputs of at least 4x4 pixels; got {h}x{w}.")
        self.fc1 = nn.Linear(flat, 384)
        self.fc2 = nn.Linear(384, 192)
        self.out = nn.Linear(192, num_classes)

    head_layer = "fc1"

    def features(self, x: Tensor) -> Tensor:
        """``Tensor[B, d]``: the flattened output of the two conv/pool stages.

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.

        Returns:
            ``Tensor[B, d]``.
        """
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)

    def head(self, z: Tensor, features: bool = False) -> Tensor:
        """Logits from :meth:`features` (``features=True``: the fc2 pre-activations).

        Args:
            z: ``Tensor[B, d]`` from :meth:`features`.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        z = self.fc2(F.relu(self.fc1(z)))
        return z if features else self.out(F.relu(z))

    def forward(self, x: Tensor, features: bool = False) -> Tensor:
        """``head(features(x))``: ``Tensor[batch, num_classes]`` logits (``features=True``: the head's features).

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        return self.head(self.features(x), features)


class SmallCNN(nn.Module):
    """FedOUI's SmallCNN: conv3x3(32)-pool-conv3x3(64)-pool-FC(->128, the OUI layer)-FC(num_classes)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int):
        super().__init__()
        c, h, w = _check_input_shape(input_shape, True, "SmallCNN")
        self.conv1 = nn.Conv2d(c, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        flat = 64 * (h // 4) * (w // 4)
        if flat == 0:
            raise ValueError(f"SmallCNN needs inputs of at least 4x4 pixels; got {h}x{w}.")
        self.fc1 = nn.Linear(flat, 128)
        self.out = nn.Linear(128, num_classes)

    head_layer = "fc1"

    def features(self, x: Tensor) -> Tensor:
        """``Tensor[B, d]``: the flattened output of the two conv/pool stages.

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.

        Returns:
            ``Tensor[B, d]``.
        """
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)

    def head(self, z: Tensor, features: bool = False) -> Tensor:
        """Logits from :meth:`features` (``features=True``: the fc1 pre-activations, the OUI layer).

        Args:
            z: ``Tensor[B, d]`` from :meth:`features`.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        z = self.fc1(z)
        return z if features else self.out(F.relu(z))

    def forward(self, x: Tensor, features: bool = False) -> Tensor:
        """``head(features(x))``: ``Tensor[batch, num_classes]`` logits (``features=True``: the head's features).

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        return self.head(self.features(x), features)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(1, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(1, cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(1, cout))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet-20 for small images (He et al. 2016) with GroupNorm(1) in place of BatchNorm.

    ``depth = 6n + 2``: 20 (default), 56 or 110 give CRAFT's ResNet-20/56/110.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, depth: int = 20, width: int = 16):
        super().__init__()
        c, _, _ = _check_input_shape(input_shape, True, "ResNet20")
        if (depth - 2) % 6:
            raise ValueError(f"ResNet depth must be 6n+2 (20, 56, 110, ...); got {depth}.")
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(c, width, 3, 1, 1, bias=False)
        self.norm = nn.GroupNorm(1, width)
        blocks, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for b in range(n):
                blocks.append(_BasicBlock(cin, cout, 2 if (stage > 0 and b == 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.out = nn.Linear(cin, num_classes)

    head_layer = "out"

    def features(self, x: Tensor) -> Tensor:
        """``Tensor[B, 4 width]``: the pooled output of the residual stages (already post-ReLU).

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.

        Returns:
            ``Tensor[B, d]``.
        """
        x = self.blocks(F.relu(self.norm(self.conv(x))))
        return F.adaptive_avg_pool2d(x, 1).flatten(1)

    def head(self, z: Tensor, features: bool = False) -> Tensor:
        """Logits from :meth:`features` (``features=True``: ``z`` itself, the penultimate features).

        Args:
            z: ``Tensor[B, d]`` from :meth:`features`.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        return z if features else self.out(z)

    def forward(self, x: Tensor, features: bool = False) -> Tensor:
        """``head(features(x))``: ``Tensor[batch, num_classes]`` logits (``features=True``: the head's features).

        Args:
            x: ``Tensor[B, *input_shape]`` inputs.
            features: return the head's features instead of the logits.

        Returns:
            ``Tensor[B, num_classes]`` logits (or ``Tensor[B, h]`` features).
        """
        return self.head(self.features(x), features)


MODELS = {"mlp": MLP, "cnn": CNN, "smallcnn": SmallCNN, "resnet20": ResNet20}


def make_model(name: str, input_shape: Sequence[int], num_classes: int, *, seed: int | None = 0, **kwargs) -> nn.Module:
    """Build a package model by name with seeded initial weights.

    Args:
        name: one of ``"mlp"``, ``"cnn"``, ``"smallcnn"``, ``"resnet20"``.
        input_shape: shape of one input, e.g. ``federation.input_shape``.
        num_classes: number of classes.
        seed: seed of the weight initialisation (``None``: torch's global RNG).
        **kwargs: passed to the model class (e.g. ``hidden=(64,)`` or ``depth=56``).

    Example:
        >>> model = make_model("cnn", (1, 8, 8), 10, seed=0)
        >>> model(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string such as 'mlp', got {type(name).__name__}.")
    key = name.lower().replace("-", "").replace("_", "")
    if key not in MODELS:
        raise ValueError(f"Unknown model {name!r}; choose one of {sorted(MODELS)}.")
    num_classes = check_int(num_classes, "num_classes", 2)
    if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__"):
        raise TypeError(f"input_shape must be a sequence of sizes such as (1, 8, 8), got {input_shape!r}.")
    input_shape = tuple(check_int(s, "input_shape entries", 1) for s in input_shape)
    if "hidden" in kwargs:
        if isinstance(kwargs["hidden"], (str, bytes)) or not hasattr(kwargs["hidden"], "__iter__"):
            raise TypeError(f"hidden must be a sequence of layer sizes such as (200, 200), got {kwargs['hidden']!r}.")
        kwargs["hidden"] = tuple(check_int(h, "hidden layer sizes", 1) for h in kwargs["hidden"])
    if seed is None:
        return MODELS[key](input_shape, num_classes, **kwargs)
    seed = check_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[key](input_shape, num_classes, **kwargs)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars.

    Args:
        model: the network.

    Returns:
        The number of elements of the parameters that require gradients.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

"""Argument checks shared by the whole package: one place, one wording.

Every public function validates its arguments at the boundary with these helpers, so
a bad call gets a ``TypeError``/``ValueError`` that names the argument instead of a
NumPy or torch internal error (or, worse, a silently wrong result).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["check_int", "check_float", "check_seed", "as_vector", "as_labels", "check_model_data", "check_trainable"]


def check_int(value: Any, name: str, minimum: int | None = None) -> int:
    """``value`` as a Python int, refusing bools, floats (even ``2.0``), strings and NaN.

    Args:
        value: anything with ``__index__`` (int, NumPy integer, 0-d integer tensor).
        name: the argument's name, for the message.
        minimum: smallest allowed value (``None``: no bound).

    Returns:
        ``int(value)``.

    Raises:
        TypeError: ``value`` is not an integer.
        ValueError: ``value < minimum``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got a bool ({value!r}).")
    try:
        out = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}.")
    return int(out)


def check_float(value: Any, name: str, *, positive: bool = False, nonnegative: bool = False) -> float:
    """``value`` as a finite Python float; strings and other non-numbers are refused.

    Args:
        value: a real number (int, float, NumPy scalar, 0-d tensor).
        name: the argument's name, for the message.
        positive: require ``value > 0``.
        nonnegative: require ``value >= 0``.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: not a real number (``"1"`` is a string, not a number).
        ValueError: NaN, infinite, or outside the requested range.
    """
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).")
    try:
        out = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    if positive and out <= 0:
        raise ValueError(f"{name} must be > 0, got {out}.")
    if nonnegative and out < 0:
        raise ValueError(f"{name} must be >= 0, got {out}.")
    return out


def check_seed(seed: Any, name: str = "seed") -> int:
    """A seed: a non-negative integer (NumPy's ``SeedSequence`` and ``default_rng`` take no negatives).

    Args:
        seed: the seed.
        name: the argument's name, for the message.

    Returns:
        ``int(seed)``.
    """
    return check_int(seed, name, 0)


def as_vector(values: Any, name: str, per: str, empty: str, dtype=None) -> np.ndarray:
    """``values`` (list, ndarray or Tensor) as a non-empty 1-D NumPy array.

    Args:
        values: the argument.
        name: its name, for the messages.
        per: what one entry is, e.g. ``"one label per sample"``.
        empty: what to say when it is empty.
        dtype: NumPy dtype to convert to (default: keep).

    Returns:
        ``ndarray[n]``.

    Raises:
        TypeError: not numbers.
        ValueError: not 1-D, or empty.
    """
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch.Tensor
        values = values.detach().cpu()
        values = values.to(torch.float64).numpy() if dtype is not None else values.numpy()
    try:
        arr = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise TypeError(f"{name} must be a 1-D array of numbers, {per} ({err}).") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D ({per}), got shape {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: {empty}.")
    return arr


def as_labels(labels: Any, name: str = "labels") -> np.ndarray:
    """``labels`` (list, ndarray or Tensor) as a 1-D int64 array of non-negative class ids.

    Args:
        labels: one class id per sample; integer-valued floats are accepted.
        name: the argument's name, for the message.

    Returns:
        ``ndarray[n]`` of int64.

    Raises:
        TypeError: not integer class ids.
        ValueError: not 1-D, empty, NaN/Inf, non-integer floats or negative ids.
    """
    y = as_vector(labels, name, "one label per sample", "there is nothing to partition")
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    elif y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):
            raise ValueError(f"{name} contain NaN or infinite values.")
        if not np.all(y == np.round(y)):
            raise ValueError(f"{name} must be integer class ids; got non-integer floats.")
        if np.abs(y).max() >= 2**62:
            raise ValueError(f"{name} holds class ids too large for int64 (up to {np.abs(y).max():g}).")
        y = y.astype(np.int64)
    elif y.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer class ids, got dtype {y.dtype}.")
    y = y.astype(np.int64, copy=False)
    if y.min() < 0:
        raise ValueError(f"{name} must be >= 0, found {int(y.min())}.")
    return y


def check_trainable(model: nn.Module) -> None:
    """Refuse, once and for every engine, a model the package's functional training cannot train.

    Both engines train through ``torch.func.functional_call``: BatchNorm's running
    statistics are buffers updated in place during the forward pass, which the vectorised
    engine cannot batch and the loop engine's ``grad`` transform refuses. The package
    models use GroupNorm instead.

    Args:
        model: the network to be trained.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``model`` holds a BatchNorm layer.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"model {type(model).__name__} has a BatchNorm layer ({name!r}, {type(module).__name__}); "
                "fedlearn_edu's engines (loop and vmap) cannot train BatchNorm's running statistics. "
                "Use GroupNorm (nn.GroupNorm), as the package models do."
            )


def check_model_data(model: nn.Module, input_shape, num_classes: int, data_name: str, dtype=None) -> None:
    """Check once, before any training, that ``model`` fits a data set.

    One forward pass on a single zero input of ``input_shape`` must give
    ``Tensor[1, num_classes]`` floating-point logits. The message names the model and
    the data set, instead of the torch error ("mat1 and mat2 shapes cannot be
    multiplied", "Target 7 is out of bounds") that would otherwise surface in round 1.

    Args:
        model: the network to be trained.
        input_shape: shape of one input of the data set, e.g. ``(1, 8, 8)``.
        num_classes: size of the data set's label space.
        data_name: how to call the data set in the message.
        dtype: the inputs' dtype (default: the model's parameter dtype).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or the inputs' dtype is not the model's.
        ValueError: the model cannot take the inputs, or gives the wrong number of logits.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    what = f"model {type(model).__name__}"
    data = f"data set {data_name!r}" if data_name else "the data set"
    first = next(iter(model.parameters()), None)
    if first is None:
        raise ValueError(f"{what} has no parameters to train.")
    if dtype is not None and dtype != first.dtype:
        raise TypeError(f"{what} has {first.dtype} parameters but {data} holds {dtype} inputs; convert one of them.")
    sample = torch.zeros((1, *input_shape), dtype=first.dtype, device=first.device)
    if first.device.type == "meta":
        return
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model(sample)
    except Exception as err:  # any failure of the forward pass is a mismatch
        raise ValueError(
            f"{what} cannot take the inputs of {data} (one input has shape {tuple(input_shape)}): "
            f"{type(err).__name__}: {err}. Build the model with input_shape={tuple(input_shape)}."
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != 1:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"{what} must map a batch of inputs to logits [batch, classes]; got {shape} on {data}.")
    if out.shape[1] != num_classes:
        raise ValueError(
            f"{what} gives {out.shape[1]} logits but {data} has {num_classes} classes; "
            f"build it with num_classes={num_classes}."
        )
    if not out.is_floating_point():
        raise TypeError(f"{what} returns {out.dtype} logits on {data}; cross-entropy needs floating-point logits.")

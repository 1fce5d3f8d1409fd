"""Argument checks shared by the whole package: one place, one wording.

Every public function validates its arguments at the boundary with these helpers, so
a bad call gets a ``TypeError``/``ValueError`` that names the argument instead of a
NumPy or torch internal error (or, worse, a silently wrong result).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "check_int",
    "check_float",
    "check_positive",
    "check_range",
    "check_seed",
    "check_bool",
    "check_norm_order",
    "check_instance",
    "check_name",
    "check_choice",
    "check_path",
    "as_vector",
    "as_labels",
    "check_model_data",
    "check_trainable",
    "Updates",
    "all_finite",
    "nonfinite_keys",
    "first_nonfinite_row",
    "check_updates",
    "check_weights",
    "as_tensor_arg",
    "check_finite",
    "check_rcond",
    "check_losses",
    "check_reference",
    "check_stacked_like",
    "check_counts",
    "check_num_clients",
]


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as a Python int, refusing bools, floats (even ``2.0``), strings and NaN.

    Args:
        value: anything with ``__index__`` (int, NumPy integer, 0-d integer tensor).
        name: the argument's name, for the message.
        minimum: smallest allowed value (``None``: no bound).
        maximum: largest allowed value (``None``: no bound).

    Returns:
        ``int(value)``.

    Raises:
        TypeError: ``value`` is not an integer.
        ValueError: ``value < minimum`` or ``value > maximum``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got a bool ({value!r}).")
    try:
        out = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}.")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}.")
    return int(out)


def check_float(value: Any, name: str) -> float:
    """``value`` as a finite Python float; strings and other non-numbers are refused.

    Args:
        value: a real number (int, float, NumPy scalar, one-element tensor).
        name: the argument's name, for the message.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: not a real number (``"1"`` is a string, not a number).
        ValueError: NaN or infinite (:func:`check_positive` and :func:`check_range` add bounds).
    """
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).")
    try:
        out = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    return out


def check_positive(value: Any, name: str, allow_zero: bool = False) -> float:
    """``value`` as a finite Python float ``> 0`` (``>= 0`` with ``allow_zero``).

    Args:
        value: a real number (int, float, NumPy scalar, one-element tensor).
        name: the argument's name, for the message.
        allow_zero: accept ``0``.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: not a real number.
        ValueError: NaN, infinite, negative, or zero without ``allow_zero``.
    """
    out = check_float(value, name)
    if out < 0 or (out == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value!r}.")
    return out


def check_range(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
) -> float:
    """``value`` as a finite Python float in the interval from ``low`` to ``high``.

    Args:
        value: a real number (int, float, NumPy scalar, one-element tensor).
        name: the argument's name, for the message.
        low: the lower bound (``None``: none).
        high: the upper bound (``None``: none).
        low_open: exclude ``low`` itself (``(low, ...``).
        high_open: exclude ``high`` itself (``..., high)``).
        why: a parenthetical for the message, e.g. ``"(clients must keep training data)"``.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: not a real number.
        ValueError: NaN, infinite, or outside the interval; the message writes the interval
            as ``[0, 1)`` and shows ``value`` with ``repr``.
    """
    out = check_float(value, name)
    below = low is not None and (out <= low if low_open else out < low)
    above = high is not None and (out >= high if high_open else out > high)
    if below or above:
        if high is None:
            interval = f"{'>' if low_open else '>='} {low:g}"
        elif low is None:
            interval = f"{'<' if high_open else '<='} {high:g}"
        else:
            interval = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be {interval}{' ' + why if why else ''}, got {value!r}.")
    return out


def check_norm_order(value: Any, name: str = "norm_order") -> float:
    """``value`` as the order p of a vector norm: a real number ``> 0``, ``inf`` included.

    Args:
        value: p (``1``, ``2``, ``math.inf``, ...; NumPy scalars and one-element tensors too).
        name: the argument's name, for the message.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: not a real number (``"fro"``, ``"inf"``, ``None``, a bool).
        ValueError: NaN, ``-inf``, zero or negative.
    """
    why = "(p of the norm: 1, 2, inf, ...)"
    if isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    try:
        return check_range(value, name, 0, None, low_open=True, why=why)
    except ValueError:
        raise ValueError(f"{name} must be > 0 or inf {why}, got {value!r}.") from None


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a bool: ``True``/``False`` (or a NumPy bool) only, never a truthy string or number.

    Args:
        value: the flag.
        name: the argument's name, for the message.

    Returns:
        ``bool(value)``.

    Raises:
        TypeError: anything else (``"no"`` would otherwise be true).
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")


def check_instance(value: Any, name: str, types, what: str):
    """``value`` when it is an instance of ``types``.

    Args:
        value: the argument.
        name: its name, for the message.
        types: a class or a tuple of classes.
        what: what it must be, for the message (``"a pandas DataFrame"``).

    Returns:
        ``value``.

    Raises:
        TypeError: ``value`` is not an instance of ``types``.
    """
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__}).")
    return value


def check_name(value: Any, name: str, example: str = "") -> str:
    """``value`` as a non-empty name: a string with something besides blanks.

    Args:
        value: the argument.
        name: its name, for the message.
        example: an example of a valid name, for the message.

    Returns:
        ``value``.

    Raises:
        TypeError: not a string.
        ValueError: empty or blank.
    """
    such = f" such as {example!r}" if example else ""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a name{such} (a string), got {value!r} ({type(value).__name__}).")
    if not value.strip():
        raise ValueError(f"{name} must be a non-empty string{such}, got {value!r}.")
    return value


def check_choice(value: Any, name: str, choices) -> str:
    """``value`` when it is one of the strings ``choices``.

    Args:
        value: the argument.
        name: its name, for the message.
        choices: the allowed strings.

    Returns:
        ``value``.

    Raises:
        TypeError: not a string.
        ValueError: not one of ``choices``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {list(choices)}, got {value!r} ({type(value).__name__}).")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")
    return value


def check_path(value: Any, name: str, what: str = "a folder's path"):
    """``value`` as a :class:`pathlib.Path` (``~`` not expanded): a ``str`` or ``os.PathLike``, not bytes.

    Args:
        value: the argument.
        name: its name, for the message.
        what: what the path names, for the message.

    Returns:
        ``pathlib.Path(value)``.

    Raises:
        TypeError: not a path (``None``, a number, bytes).
        ValueError: an empty string.
    """
    import os
    from pathlib import Path

    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be {what} (a str or pathlib.Path), got {value!r} ({type(value).__name__}).")
    if not str(value).strip():
        raise ValueError(f"{name} is empty; name {what}.")
    return Path(value)


SEED_MAX = 2**64 - 1


def check_seed(seed: Any, name: str = "seed") -> int:
    """A seed: a non-negative integer (NumPy's ``SeedSequence`` and ``default_rng`` take no negatives).

    Args:
        seed: the seed, ``0 <= seed < 2**64`` (torch's generators take 64 bits).
        name: the argument's name, for the message.

    Returns:
        ``int(seed)``.
    """
    return check_int(seed, name, 0, SEED_MAX)


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


# ------------------------------------------------------------------ tensors of the aggregation functions
Updates = Tensor | Mapping[str, Tensor]


def all_finite(tensors: Iterable[Tensor]) -> bool:
    """``True`` when a fused test proves every element of every tensor finite.

    One sum per tensor and one device-to-host transfer for all of them. A sum is NaN or
    Inf whenever one of its terms is, so ``True`` is exact; ``False`` means "look element
    by element": some value is NaN/Inf, or a sum of finite values overflowed. About 30x
    cheaper on the CPU than ``torch.isfinite(t).all()``, which writes a mask first.

    Args:
        tensors: the tensors to test (any devices and dtypes).

    Returns:
        ``True`` when proved finite; ``False`` when some tensor must be tested element by element.
    """
    sums = [t.sum() for t in tensors if t.numel()]
    if not sums:
        return True
    if len({s.device for s in sums}) > 1:
        return all(bool(torch.isfinite(s)) for s in sums)
    return bool(torch.isfinite(torch.stack([s.to(torch.promote_types(s.dtype, torch.float32)) for s in sums])).all())


def nonfinite_keys(tree: Mapping[str, Tensor]) -> list[str]:
    """The keys of ``tree`` whose tensors hold NaN or Inf (``[]`` when the fused :func:`all_finite` passes).

    Args:
        tree: ``{name: Tensor}``.

    Returns:
        The names of the tensors holding NaN or Inf, in ``tree``'s order.
    """
    if all_finite(tree.values()):
        return []
    return [k for k, v in tree.items() if not bool(torch.isfinite(v).all())]


def first_nonfinite_row(t: Tensor) -> int | None:
    """The first row (client) of ``t`` that holds NaN or Inf.

    Args:
        t: ``Tensor[m, ...]``, one row per client.

    Returns:
        The row's index, or ``None`` when every element is finite.
    """
    bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(dim=1)
    return int(bad.nonzero()[0]) if bool(bad.any()) else None


def _raise_first_nonfinite(checked: list[tuple[str, Tensor]]) -> None:
    """The element-by-element test: raise naming the first client (row) with NaN/Inf, if any."""
    for label, t in checked:
        i = first_nonfinite_row(t)
        if i is not None:
            # a row of the stacked tensors, not a client id: the caller (the driver) knows the ids
            raise ValueError(f"{label}: row {i} of the stacked updates contains NaN or Inf.")


def check_updates(updates: Updates, what: str = "deltas", finite: bool = True) -> int:
    """Check a ``Tensor[m, d]`` or dict of ``Tensor[m, ...]``: one client axis, finite values.

    Returns m. Raises ``ValueError`` naming the first client with NaN/Inf. With
    ``finite=False`` only the structure is checked (for callers that detect NaN/Inf
    more cheaply themselves and call this again to name the client, or that have scanned
    them already: the aggregation functions' ``check=False``). The values are tested by one
    fused pass (:func:`all_finite`) and row by row only when it fails.

    Args:
        updates: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``, floating point.
        what: the argument's name, for the messages.
        finite: also test the values for NaN/Inf.

    Returns:
        m, the number of clients.

    Raises:
        TypeError: not a tensor or dict of floating-point tensors.
        ValueError: no client, mismatched client axes, or NaN/Inf (naming the first such client).
    """
    finite = check_bool(finite, "check")  # the aggregation functions' ``check`` flag comes through here
    if not isinstance(updates, (Tensor, Mapping)):
        raise TypeError(
            f"{what} must be a torch.Tensor[m, d] or a dict of Tensor[m, ...], got {type(updates).__name__}."
        )
    items = {"": updates}.items() if isinstance(updates, Tensor) else updates.items()
    m = None
    checked: list[tuple[str, Tensor]] = []  # structure checked, values still to test
    try:
        for name, t in items:
            m = _check_structure(updates, what, name, t, m)
            if m and finite:
                checked.append((f"{what}[{name!r}]" if name else what, t))
    except (TypeError, ValueError):
        # the tensors before the malformed one are tested first, as one pass in order would
        if finite and not all_finite(t for _, t in checked):
            _raise_first_nonfinite(checked)
        raise
    if not m:
        raise ValueError(f"{what} holds no clients (m = 0): select at least one client.")
    if not all_finite(t for _, t in checked):
        _raise_first_nonfinite(checked)
    return m


def _check_structure(updates: Updates, what: str, name: str, t, m: int | None) -> int:
    """One entry of :func:`check_updates`: a floating tensor with the common client axis; returns m."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}{'[' + name + ']' if name else ''} must be a torch.Tensor, got {type(t).__name__}.")
    label = f"{what}[{name!r}]" if name else what
    if not t.is_floating_point():
        raise TypeError(f"{label} must hold floating-point values, got {t.dtype}; convert with .float().")
    if isinstance(updates, Tensor) and t.dim() != 2:
        raise ValueError(f"{label} must be Tensor[m, d] (one row per client); got shape {tuple(t.shape)}.")
    if t.dim() < 1:
        raise ValueError(f"{label} needs a leading client axis; got a scalar.")
    if m is None:
        m = t.shape[0]
    elif t.shape[0] != m:
        raise ValueError(f"{label} has {t.shape[0]} clients on its leading axis, others have {m}.")
    return m


def check_weights(weights, m: int, what: str = "weights") -> Tensor:
    """Check non-negative, finite ``Tensor[m]`` weights with a positive sum; return them as float.

    Args:
        weights: ``Tensor[m]`` (or a sequence of m numbers).
        m: the number of clients.
        what: the argument's name, for the messages.

    Returns:
        ``Tensor[m]`` floating-point weights (not normalised).

    Raises:
        TypeError: not numbers.
        ValueError: wrong shape, NaN/Inf, negative entries, or all zero.
    """
    w = as_tensor_arg(weights, what)
    if w.dim() != 1 or w.shape[0] != m:
        raise ValueError(f"{what} must be Tensor[m] with m = {m} (one per client); got shape {tuple(w.shape)}.")
    w = w.to(torch.get_default_dtype()) if not w.is_floating_point() else w
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{what} contain NaN or Inf: {w.tolist()}.")
    if bool((w < 0).any()):
        raise ValueError(f"{what} must be >= 0; got {w.tolist()}.")
    if float(w.max()) <= 0:
        raise ValueError(f"{what} sum to zero: give at least one client a positive weight.")
    return w


def as_tensor_arg(value, what: str) -> Tensor:
    """``torch.as_tensor(value)`` for a numeric argument, with a ``TypeError`` naming it otherwise.

    Args:
        value: a number, sequence of numbers, ndarray or tensor.
        what: the argument's name, for the message.

    Returns:
        The tensor (no copy when ``value`` is one).

    Raises:
        TypeError: strings, ``None``, booleans, complex numbers or anything that is not numbers.
    """
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{what} must be a tensor of numbers, got {type(value).__name__}.")
    try:
        out = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{what} must be a tensor of numbers, got {type(value).__name__} ({err}).") from None
    if out.dtype == torch.bool or out.is_complex():
        raise TypeError(f"{what} must hold real numbers, got {out.dtype}.")
    return out


def check_finite(value: Updates, what: str) -> None:
    """Raise ``ValueError`` when a tensor (or any tensor of a dict) holds NaN or Inf.

    Args:
        value: a tensor or ``{name: Tensor}``.
        what: the argument's name, for the message.

    Raises:
        TypeError: a dict entry is not a tensor.
        ValueError: NaN or Inf, naming the entry.
    """
    items = {"": value}.items() if isinstance(value, Tensor) else value.items()
    if all(isinstance(t, Tensor) for _, t in items) and all_finite(t for _, t in items):
        return
    for name, t in items:
        if not isinstance(t, Tensor):
            raise TypeError(f"{what}{'[' + repr(name) + ']' if name else ''} must be a torch.Tensor.")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{what}{'[' + repr(name) + ']' if name else ''} contains NaN or Inf.")


def check_rcond(rcond, dtype: torch.dtype, m: int, d: int) -> float:
    """The pseudo-inverse's relative cut-off: ``rcond`` (finite, >= 0) or the default for ``dtype``.

    Args:
        rcond: ``None`` or a number in [0, 1].
        dtype: the pseudo-gradients' dtype.
        m: the number of clients (rows).
        d: the number of coordinates (columns).

    Returns:
        ``rcond``, or ``eps(dtype) * max(m, d)`` for ``None``.

    Raises:
        TypeError: not a number.
        ValueError: outside [0, 1].
    """
    if rcond is None:
        return torch.finfo(dtype).eps * max(m, d)
    return check_range(rcond, "rcond", 0, 1, why="(a cut-off relative to the largest singular value)")


def check_losses(losses, m: int, what: str = "losses") -> Tensor:
    """``losses``: finite ``Tensor[m]``, one per client, as float64 on the CPU.

    Args:
        losses: ``Tensor[m]`` (or m numbers).
        m: the number of clients.
        what: the argument's name, for the messages.

    Returns:
        float64 ``Tensor[m]`` on the CPU.

    Raises:
        TypeError: not numbers.
        ValueError: wrong shape, or NaN/Inf.
    """
    x = as_tensor_arg(losses, what).detach().cpu().to(torch.float64)
    if x.shape != (m,):
        raise ValueError(f"{what} must be Tensor[m] with m = {m} (one per client); got shape {tuple(x.shape)}.")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{what} contain NaN or Inf: {x.tolist()}.")
    return x


def check_reference(reference, pseudo_grads, what: str = "reference"):
    """Reference: None, or the structure of ``pseudo_grads`` without the client axis, finite.

    Args:
        reference: ``None``, ``Tensor[d]`` or ``{name: Tensor[...]}``.
        pseudo_grads: the client quantities it goes with, ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}``.
        what: the argument's name, for the messages.

    Returns:
        ``reference`` itself (``None`` stays ``None``).

    Raises:
        TypeError: a reference that is not a tensor for ``Tensor[m, d]`` pseudo_grads.
        ValueError: other keys or shapes, or NaN/Inf.
    """
    if reference is None:
        return None
    if isinstance(pseudo_grads, Tensor):
        if not isinstance(reference, Tensor):
            raise TypeError(f"{what} must be a Tensor[d] (or None) for Tensor[m, d] pseudo_grads.")
        if reference.shape != pseudo_grads.shape[1:]:
            raise ValueError(
                f"{what} must have shape {tuple(pseudo_grads.shape[1:])} (d); got {tuple(reference.shape)}."
            )
        if not bool(torch.isfinite(reference).all()):
            raise ValueError(f"{what} contains NaN or Inf.")
        return reference
    if not isinstance(reference, Mapping) or set(reference) != set(pseudo_grads):
        raise ValueError(
            f"{what} must be a dict with the same keys as pseudo_grads ({sorted(pseudo_grads)[:6]}...), or None."
        )
    for k, v in reference.items():
        if tuple(v.shape) != tuple(pseudo_grads[k].shape[1:]):
            raise ValueError(f"{what}[{k!r}] must have shape {tuple(pseudo_grads[k].shape[1:])}; got {tuple(v.shape)}.")
        if not bool(torch.isfinite(v).all()):
            raise ValueError(f"{what}[{k!r}] contains NaN or Inf.")
    return reference


def check_stacked_like(x: Updates, like: Updates, what: str, like_what: str, finite: bool = True) -> None:
    """``x`` must be finite and have exactly ``like``'s structure and shapes (client axis included).

    Args:
        x: ``Tensor[m, d]`` or ``{name: Tensor[m, ...]}`` to check.
        like: the quantity ``x`` must match.
        what: ``x``'s name, for the messages.
        like_what: ``like``'s name, for the messages.
        finite: also refuse NaN/Inf in ``x`` (``False``: the structure only).

    Raises:
        TypeError: not floating-point tensors.
        ValueError: other keys or shapes, or NaN/Inf.
    """
    check_updates(x, what, finite=finite)
    if isinstance(like, Tensor):
        if not isinstance(x, Tensor) or x.shape != like.shape:
            shape = tuple(x.shape) if isinstance(x, Tensor) else "a dict"
            raise ValueError(f"{what} must have the shape of {like_what}, {tuple(like.shape)}; got {shape}.")
        return
    if not isinstance(x, Mapping) or set(x) != set(like):
        raise ValueError(f"{what} must be a dict with the keys of {like_what} ({sorted(like)[:6]}...).")
    for k, v in like.items():
        if x[k].shape != v.shape:
            raise ValueError(
                f"{what}[{k!r}] must have shape {tuple(v.shape)} like {like_what}; got {tuple(x[k].shape)}."
            )


def check_counts(values, m: int, what: str) -> Tensor:
    """A number or ``Tensor[m]`` of finite values > 0 (local step counts), as float64 ``Tensor[m]``.

    Args:
        values: a number or ``Tensor[m]``.
        m: the number of clients.
        what: the argument's name, for the messages.

    Returns:
        float64 ``Tensor[m]`` on the CPU (a number is repeated m times).

    Raises:
        ValueError: wrong shape, non-finite or non-positive values.
    """
    t = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    if t.dim() == 0:
        t = t.expand(m).clone()
    if t.shape != (m,):
        raise ValueError(f"{what} must be a number or Tensor[m] with m = {m} (one per client); got {tuple(t.shape)}.")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"{what} must be finite and > 0; got {t.tolist()}.")
    return t


def check_num_clients(num_clients, m: int) -> int:
    """The federation's size N: an int with N >= m (the selected clients are among the N).

    Args:
        num_clients: N.
        m: the number of selected clients.

    Returns:
        ``int(num_clients)``.

    Raises:
        TypeError: not an integer.
        ValueError: ``num_clients < m``.
    """
    return check_int(num_clients, "num_clients (N, all clients of the federation)", m)

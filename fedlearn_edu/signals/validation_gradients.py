"""Validation gradients: how steep the loss on a shared validation set is at each client's model.

FedVG (Devkota et al., 2026) scores client k after local training by the gradient
of the validation loss at the client's parameters theta_k, computed on the
**server** (the server holds the validation set; clients send only
``Delta_k = theta_k - theta_t`` as usual and the server rebuilds
``theta_k = theta_t + Delta_k``).

Definition (the authors' procedure): split the validation set into
``B = ceil(n_val / batch_size)`` consecutive batches of ``batch_size = 32``;
for every batch take the gradient of the **summed** cross-entropy over the
batch; accumulate and divide by the number of batches:

    g_k = (1 / B) * sum_b  grad_theta  sum_{i in batch b} CE(f(x_i; theta_k), y_i)
        = grad_theta [ (1 / B) * sum_{i=1}^{n_val} CE(f(x_i; theta_k), y_i) ]

The second line (the gradient is linear) is what the batched implementation
uses: the result does not depend on how the samples are grouped for the
computation, only on ``B``. Per parameter tensor l the signal is the vector
p-norm ``||g_{k,l}||_p`` of the flattened gradient (p = 1 by default).

The model runs in train mode, as in the authors' code. The package's models
have no BatchNorm and no dropout, so train mode and eval mode compute the same
function here; a model with dropout would make the signal random.

The computation is the training engines' :meth:`~fedlearn_edu.engine.LoopEngine.loss_gradients`
(one engine protocol for the clients and the server), and the two engines give
the same numbers:

* ``engine="vmap"`` (default): all clients at once, ``torch.func.vmap`` over
  ``torch.func.grad`` of a ``functional_call``, in chunks sized by a memory budget;
* ``engine="loop"``: the readable reference, one client after another, batches
  of ``batch_size`` with ``torch.autograd.grad``, exactly the authors' loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Union

import torch
from torch import Tensor, nn

from ..checks import check_int, check_norm_order, first_nonfinite_row
from ..engine import VmapEngine, make_engine
from ..params import Params, num_stacked

__all__ = ["validation_gradients", "validation_gradient_norms", "as_validation_set"]

ValData = Union[tuple, Sequence[Tensor], "torch.utils.data.TensorDataset"]


def as_validation_set(val_data, num_classes: int | None = None) -> tuple[Tensor, Tensor]:
    """Turn ``val_data`` into ``(x: Tensor[n, ...], y: Tensor[n])`` and check it.

    Accepts a pair ``(x, y)`` or a :class:`torch.utils.data.TensorDataset` of two tensors.

    Args:
        val_data: ``(x: Tensor[n, ...], y: Tensor[n])`` or a two-tensor ``TensorDataset``.
        num_classes: size of the label space, to check the labels (``None``: not checked).

    Returns:
        ``(x, y)``: floating-point inputs and int64 labels.

    Raises:
        TypeError: not a pair of tensors (or of arrays of numbers).
        ValueError: empty set, mismatched lengths, NaN/Inf inputs, non-integer or
            out-of-range labels (every message starts with ``val_data``).
    """
    if hasattr(val_data, "tensors"):
        val_data = val_data.tensors
    if not isinstance(val_data, (tuple, list)) or len(val_data) != 2:
        raise TypeError(
            "val_data must be a pair (x, y) of tensors or a TensorDataset of two tensors; "
            f"got {type(val_data).__name__}."
        )
    try:
        x, y = (torch.as_tensor(t) for t in val_data)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"val_data must hold two tensors (x, y) of numbers ({err}).") from None
    if y.dim() != 1:
        raise ValueError(f"val_data: the validation labels must be Tensor[n]; got shape {tuple(y.shape)}.")
    if x.dim() < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"val_data: the validation set has inputs of shape {tuple(x.shape)} but {y.shape[0]} labels.")
    if y.shape[0] == 0:
        raise ValueError(
            "val_data: the validation set is empty: FedVG needs at least one validation sample "
            "(e.g. fedlearn_edu.data.server_validation_split(federation, fraction=0.1))."
        )
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ValueError(f"val_data: the validation labels must be integer class ids; got dtype {y.dtype}.")
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x.reshape(x.shape[0], -1)).all(1)).sum())
        raise ValueError(
            f"val_data: the validation set holds NaN or Inf inputs ({bad} of {x.shape[0]} samples); "
            "clean it before using it (a validation gradient at such a sample is undefined)."
        )
    if num_classes is not None and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(
            f"val_data: the validation labels must lie in [0, {num_classes - 1}]; "
            f"found [{int(y.min())}, {int(y.max())}]."
        )
    return x, y.long()


def _check_params(params: Mapping[str, Tensor]) -> int:
    m = num_stacked(params)
    if m == 0:
        raise ValueError("params holds no clients (m = 0).")
    for name, t in params.items():
        i = first_nonfinite_row(t)
        if i is not None:
            raise ValueError(
                f"params[{name!r}]: the parameters of client {i} contain NaN or Inf; "
                "its validation gradient is undefined."
            )
    return m


def _check_fits(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> None:
    """One forward pass of client 0 on one validation input: the inputs fit, the labels lie in the classes.

    Raises ValueError naming ``val_data`` (or ``params``) instead of torch's shape or
    "Target 7 is out of bounds" errors from inside the batched pass.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    known = dict(model.named_parameters())
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"params holds tensors the model does not have: {unknown[:5]}.")
    wrong = [k for k, v in params.items() if tuple(v.shape[1:]) != tuple(known[k].shape)]
    if wrong:
        raise ValueError(f"params[{wrong[0]!r}] is not stacked like the model's {tuple(known[wrong[0]].shape)}.")
    one = {k: v[0].detach() for k, v in params.items()}
    try:
        with torch.no_grad():
            out = torch.func.functional_call(model, one, (x[:1],))
    except Exception as err:  # any failure of the forward pass is a mismatch of inputs and model
        raise ValueError(
            f"val_data: the model cannot take the validation inputs (one has shape {tuple(x.shape[1:])}): "
            f"{type(err).__name__}: {' '.join(str(err).split())[:200]}."
        ) from None
    if not isinstance(out, Tensor) or out.dim() != 2:
        raise ValueError("val_data: the model must give logits [batch, classes] on the validation inputs.")
    as_validation_set((x, y), num_classes=out.shape[1])  # the labels against the model's classes


def validation_gradients(
    model: nn.Module,
    params: Mapping[str, Tensor],
    val_data,
    *,
    batch_size: int = 32,
    engine: str = "vmap",
    memory_budget: int | None = None,
    sample_chunk: int | None = None,
) -> Params:
    """The batch-averaged validation-loss gradient at each of m clients' parameters.

    ``g_k = (1/B) grad sum_i CE(f(x_i; theta_k), y_i)`` with ``B = ceil(n_val / batch_size)``
    (see the module docstring): the authors' "summed cross-entropy per batch, gradients
    accumulated over batches and divided by the number of batches".

    Args:
        model: the architecture, used through :func:`torch.func.functional_call`
            (its own parameters are not used, nor modified).
        params: stacked client parameters ``{name: Tensor[m, ...]}`` (theta_k, not deltas).
        val_data: ``(x: Tensor[n, ...], y: Tensor[n])`` or a ``TensorDataset``; moved to the
            parameters' device.
        batch_size: the batch size of the definition (32 in the paper); it sets ``B``.
        engine: ``"vmap"`` (all clients in one batched pass, chunked by memory), ``"loop"``
            (one client after another, batches of ``batch_size``; the reference), ``"auto"``
            or an engine object (see :func:`fedlearn_edu.engine.make_engine`).
        memory_budget: bytes one vmapped chunk may use (default 2 GiB on the CPU, half the
            free memory on CUDA).
        sample_chunk: validation samples per vmapped pass (default: up to 2048).

    Returns:
        ``{name: Tensor[m, ...]}``: the gradient for every client and parameter tensor.

    Example:
        >>> from fedlearn_edu import make_model
        >>> from fedlearn_edu.params import get_params, stack_params
        >>> model = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
        >>> theta = stack_params([get_params(model)] * 3)
        >>> x, y = torch.rand(40, 1, 8, 8), torch.arange(40) % 10
        >>> g = validation_gradients(model, theta, (x, y))
        >>> g["out.weight"].shape
        torch.Size([3, 10, 16])
    """
    check_int(batch_size, "batch_size", 1)
    _check_params(params)
    device = next(iter(params.values())).device
    dtype = next(iter(params.values())).dtype
    x, y = as_validation_set(val_data)
    x, y = x.to(device=device, dtype=dtype), y.to(device)
    _check_fits(model, params, x, y)
    n = y.shape[0]
    num_batches = math.ceil(n / batch_size)
    runner = make_engine(engine, model)
    if memory_budget is not None and isinstance(runner, VmapEngine):
        runner = VmapEngine(memory_budget=memory_budget, max_chunk=runner.max_chunk, tune_allocator=False)
    extra = {"sample_chunk": sample_chunk} if isinstance(runner, VmapEngine) else {}
    was_training = model.training
    model.train()  # the authors' train mode; no BN/dropout in the package models, so == eval
    try:
        return runner.loss_gradients(model, dict(params), x, y, int(batch_size), num_batches, **extra)
    finally:
        model.train(was_training)


def validation_gradient_norms(
    model: nn.Module,
    params: Mapping[str, Tensor],
    val_data,
    norm_order: float = 1,
    *,
    batch_size: int = 32,
    engine: str = "vmap",
    memory_budget: int | None = None,
    sample_chunk: int | None = None,
) -> Tensor:
    """``||g_{k,l}||_p`` for every client k and parameter tensor l: FedVG's signal.

    Computes :func:`validation_gradients` (server side, all clients in one batched pass by
    default) and takes the vector p-norm of every flattened gradient tensor.

    Args:
        model: the architecture (for :func:`torch.func.functional_call`).
        params: stacked client parameters ``theta_k`` as ``{name: Tensor[m, ...]}``. A server
            that receives deltas rebuilds them first: ``theta_k = theta_t + Delta_k``.
        val_data: ``(x, y)`` or a ``TensorDataset``: the server's validation set.
        norm_order: p of the vector norm (1 by default, as in the authors' code; 2, ``inf``...).
        batch_size: see :func:`validation_gradients`.
        engine: see :func:`validation_gradients`.
        memory_budget: see :func:`validation_gradients`.
        sample_chunk: see :func:`validation_gradients`.

    Returns:
        ``Tensor[m, L]``, L = number of parameter tensors, columns in the order of ``params``.

    Raises:
        ValueError: empty validation set; NaN/Inf parameters or gradients (names the client);
            ``norm_order`` not > 0 (inf allowed).
        TypeError: ``norm_order`` not a real number.

    Example:
        >>> from fedlearn_edu import make_model
        >>> from fedlearn_edu.params import get_params, stack_params
        >>> model = make_model("mlp", (1, 8, 8), 10, hidden=(16,))
        >>> theta = stack_params([get_params(model)] * 3)
        >>> x, y = torch.rand(40, 1, 8, 8), torch.arange(40) % 10
        >>> validation_gradient_norms(model, theta, (x, y)).shape   # 4 tensors: 2 weights, 2 biases
        torch.Size([3, 4])
    """
    p = check_norm_order(norm_order)
    grads = validation_gradients(
        model,
        params,
        val_data,
        batch_size=batch_size,
        engine=engine,
        memory_budget=memory_budget,
        sample_chunk=sample_chunk,
    )
    m = num_stacked(grads)
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(m, -1), ord=p, dim=1) for g in grads.values()], dim=1)
    i = first_nonfinite_row(norms)
    if i is not None:
        if all(first_nonfinite_row(g) is None for g in grads.values()):  # finite gradients, overflowing norms
            raise ValueError(
                f"The norm_order={p:g} norms of client {i}'s (finite) validation gradient overflow: a small p "
                "raises the entries to 1/p; use norm_order >= 1 (1, 2, inf)."
            )
        raise ValueError(
            f"The validation gradient of client {i} is NaN or Inf (its model overflows on the "
            "validation set); lower the client learning rate."
        )
    return norms

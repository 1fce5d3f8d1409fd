"""The one representation of model parameters.

* One model's parameters: ``Params = dict[str, Tensor]``, keyed by
  ``model.named_parameters()`` names.
* Many clients' parameters: the same dict with a leading client axis,
  ``dict[str, Tensor[m, ...]]`` -- the :func:`torch.func.stack_module_state`
  layout. Client deltas Delta_i = theta_i - theta_t use this layout too.

Everything else (aggregation math, strategies, engines) speaks this layout, so
``torch.func.functional_call(model, params, x)`` runs any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

Params = dict[str, Tensor]

__all__ = [
    "Params",
    "get_params",
    "stack_params",
    "unstack_params",
    "num_stacked",
    "flatten_params",
    "tree_map",
    "layer_groups",
    "repeat_params",
    "select_rows",
    "tree_leaves",
    "map_tensors",
    "to_device",
]


def get_params(model: nn.Module) -> Params:
    """A detached copy of ``model``'s parameters as ``{name: Tensor}``.

    Args:
        model: the network (not modified).

    Returns:
        ``{name: Tensor}`` keyed as ``model.named_parameters()``.
    """
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def tree_map(fn: Callable[..., Tensor], *trees: Mapping[str, Tensor]) -> Params:
    """Apply ``fn`` leaf-wise to dicts sharing the same keys: ``{k: fn(t1[k], t2[k], ...)}``.

    Args:
        fn: a function of as many tensors as there are dicts.
        *trees: dicts with the same keys.

    Returns:
        ``{k: fn(...)}`` in the first dict's key order.

    Raises:
        ValueError: the dicts' keys differ.
    """
    first = trees[0]
    for t in trees[1:]:
        if t.keys() != first.keys():
            raise ValueError(f"Parameter dicts have different keys: {sorted(first)} vs {sorted(t)}.")
    return {k: fn(*(t[k] for t in trees)) for k in first}


def stack_params(params_list: Sequence[Mapping[str, Tensor]]) -> Params:
    """Stack m parameter dicts on a new leading client axis: ``{k: Tensor[m, ...]}``.

    Args:
        params_list: m dicts ``{name: Tensor[...]}`` with the same keys and shapes.

    Returns:
        ``{name: Tensor[m, ...]}``.

    Raises:
        ValueError: an empty list, or dicts with other keys.
    """
    if len(params_list) == 0:
        raise ValueError("stack_params needs at least one parameter dict.")
    return tree_map(lambda *ts: torch.stack(ts), *params_list)


def unstack_params(stacked: Mapping[str, Tensor]) -> list[Params]:
    """Inverse of :func:`stack_params`.

    Args:
        stacked: ``{name: Tensor[m, ...]}``.

    Returns:
        m dicts ``{name: Tensor[...]}`` (views, not copies).
    """
    m = num_stacked(stacked)
    return [{k: v[i] for k, v in stacked.items()} for i in range(m)]


def num_stacked(stacked: Mapping[str, Tensor]) -> int:
    """Size m of the leading client axis, checked to agree across all entries.

    Args:
        stacked: ``{name: Tensor[m, ...]}``.

    Returns:
        m.

    Raises:
        ValueError: an empty dict, a scalar entry, or entries with different m.
    """
    if len(stacked) == 0:
        raise ValueError("Empty parameter dict.")
    sizes = {k: v.shape[0] if v.dim() else None for k, v in stacked.items()}
    values = set(sizes.values())
    if len(values) != 1 or None in values:
        raise ValueError(f"Stacked parameters must share one leading client axis; got sizes {sizes}.")
    return values.pop()


def flatten_params(params: Mapping[str, Tensor], stacked: bool = False) -> Tensor:
    """Concatenate parameters into one vector.

    Returns ``Tensor[d]`` for one model, or ``Tensor[m, d]`` when ``stacked``.

    Args:
        params: ``{name: Tensor[...]}``, or ``{name: Tensor[m, ...]}`` with ``stacked``.
        stacked: whether the tensors carry a leading client axis.
    """
    if stacked:
        m = num_stacked(params)
        return torch.cat([v.reshape(m, -1) for v in params.values()], dim=1)
    return torch.cat([v.reshape(-1) for v in params.values()])


def layer_groups(names: Sequence[str] | Mapping[str, Tensor]) -> dict[str, list[str]]:
    """Group parameter names by module: ``{"fc1": ["fc1.weight", "fc1.bias"], ...}``.

    A layer group is one module's parameters (weight and bias together), the unit
    of the layer-wise methods (CRAFT, FedVG).

    Args:
        names: parameter names in order, or a parameter dict (its keys).

    Returns:
        ``{module: [names]}`` in the order the modules first appear.
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        module = name.rsplit(".", 1)[0] if "." in name else name
        groups.setdefault(module, []).append(name)
    return groups


def repeat_params(params: Mapping[str, Tensor], n: int) -> Params:
    """``n`` copies of one model stacked on a leading axis.

    Args:
        params: one model ``{name: Tensor[...]}``.
        n: the number of copies.

    Returns:
        ``{name: Tensor[n, ...]}`` (fresh, detached tensors).
    """
    return {k: v.detach().unsqueeze(0).repeat(n, *([1] * v.dim())).clone() for k, v in params.items()}


def select_rows(tree: Mapping, index: Tensor) -> dict:
    """Rows ``index`` of every ``Tensor[N, ...]`` in a nested dict (a client state).

    Args:
        tree: ``{name: Tensor[N, ...] or a dict of them}``.
        index: ``Tensor[m]`` client ids, or ``Tensor[N]`` (bool) a mask.

    Returns:
        The same nesting with ``Tensor[m, ...]`` leaves (moved with ``index`` to each leaf's device).
    """
    return {k: select_rows(v, index) if isinstance(v, Mapping) else v[index.to(v.device)] for k, v in tree.items()}


def tree_leaves(tree: Mapping):
    """The tensors of a nested dict whose values are tensors or dicts of tensors.

    Args:
        tree: ``{name: Tensor or a dict of them}``.

    Yields:
        Each tensor, depth first in key order.
    """
    for v in tree.values():
        yield from (tree_leaves(v) if isinstance(v, Mapping) else (v,))


def map_tensors(fn: Callable[[Tensor], Tensor], obj):
    """``fn`` applied to every tensor in a nested dict/list/tuple (other values unchanged).

    Args:
        fn: a function of one tensor.
        obj: a tensor, or dicts, lists, tuples and typed server states (mapping dataclasses,
            :mod:`fedlearn_edu.strategies.state`) of them and of other values.

    Returns:
        The same nesting (new containers of the same types), every tensor ``t`` replaced by ``fn(t)``.
    """
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    if isinstance(obj, Mapping) and dataclasses.is_dataclass(obj):  # a typed server state
        fields = dataclasses.fields(obj)
        return dataclasses.replace(obj, **{f.name: map_tensors(fn, getattr(obj, f.name)) for f in fields})
    return obj


def to_device(obj, device: str | torch.device):
    """Every tensor in a nested dict/list/tuple moved to ``device`` (:func:`map_tensors`).

    Args:
        obj: a tensor, or dicts, lists and tuples of them and of other values.
        device: the target device.

    Returns:
        The same nesting with ``t.to(device)`` for every tensor ``t``.
    """
    return map_tensors(lambda t: t.to(device), obj)

"""The terms SCAFFOLD and FedDyn add to a client's local loss: pure functions of one client's parameters.

A client minimises ``CE(model(x; theta), y) + term(theta)``. Each function here takes one
client's parameters ``{name: Tensor[...]}`` and that client's state (unstacked) and returns
a scalar, built from plain tensor operations only, so that ``torch.func.grad`` and
``torch.func.vmap`` over a stacked client axis apply (the vectorised engine) as well as
``loss.backward()`` (the loop engine).

* SCAFFOLD (Karimireddy et al., 2020): the corrected gradient ``g_i(y) - c_i + c`` is the
  gradient of ``L_i(y) + <c - c_i, y>``: ``linear_term(y, c - c_i)``.
* FedDyn (Acar et al., 2021): ``L_k(theta) - <phi_k, theta> + (alpha/2) ||theta - theta^{t-1}||^2``:
  ``proximal_term(theta, theta^{t-1}, alpha) + linear_term(theta, -phi_k)``.

The engines add both terms to the cross-entropy (``prox_mu`` and ``linear`` of
:meth:`fedlearn_edu.engine.LoopEngine.train`); the strategies supply the vectors.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["linear_term", "proximal_term"]


def _same_keys(params: Mapping[str, Tensor], other: Mapping[str, Tensor], what: str) -> None:
    if not isinstance(other, Mapping) or other.keys() != params.keys():
        keys = sorted(other) if isinstance(other, Mapping) else type(other).__name__
        raise ValueError(f"{what} must be a dict with the parameters' keys {sorted(params)}; got {keys}.")


def linear_term(params: Mapping[str, Tensor], vector: Mapping[str, Tensor]) -> Tensor:
    """``<v, theta> = sum_k sum(v_k * theta_k)`` over the parameter tensors; its gradient is ``v``.

    Args:
        params: one client's parameters ``{name: Tensor[...]}``.
        vector: ``{name: Tensor[...]}`` with the same keys and shapes.

    Returns:
        Scalar ``Tensor``.

    Example:
        >>> linear_term({"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, -1.0])})
        tensor(1.)
    """
    _same_keys(params, vector, "vector")
    return sum((v.to(p.dtype) * p).sum() for p, v in ((params[k], vector[k]) for k in params))


def proximal_term(params: Mapping[str, Tensor], anchor: Mapping[str, Tensor], mu: float) -> Tensor:
    """``(mu/2) ||theta - anchor||^2`` over the parameter tensors; its gradient is ``mu (theta - anchor)``.

    Args:
        params: one client's parameters ``{name: Tensor[...]}``.
        anchor: the proximal centre, same keys and shapes.
        mu: the coefficient.

    Returns:
        Scalar ``Tensor``.

    Example:
        >>> proximal_term({"w": torch.tensor([1.0, 2.0])}, {"w": torch.zeros(2)}, mu=0.5)
        tensor(1.2500)
    """
    _same_keys(params, anchor, "anchor")
    return 0.5 * mu * sum(torch.square(params[k] - anchor[k].to(params[k].dtype)).sum() for k in params)

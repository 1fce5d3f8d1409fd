"""Checkers for the book's implementation exercises (and for grading coursework).

Each ``check_<name>(your_function)`` runs the reader's function against the package on
random and edge-case inputs, and prints either a pass or the **first** failing input with the
expected and the received values. It returns ``True`` on a pass, ``False`` otherwise, so an
instructor can use it in an autograder::

    >>> import torch
    >>> from fedlearn_edu.exercises import check_fedavg
    >>> def my_fedavg(deltas, weights):
    ...     p = weights / weights.sum()
    ...     return (p[:, None] * deltas).sum(0)
    >>> check_fedavg(my_fedavg)
    check_fedavg: all 6 cases passed.
    True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = ["Case", "run_cases", "check_fedavg"]


@dataclass
class Case:
    """One input for a checker: a description, positional arguments, and the expected output."""

    name: str
    args: tuple
    expected: object


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return x


def _show(x, limit: int = 400) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit] + " ..."


def run_cases(title: str, your_function: Callable, cases: Sequence[Case], rtol: float = 1e-5,
              atol: float = 1e-6) -> bool:
    """Run ``your_function(*case.args)`` for each case; print a pass or the first failure."""
    for case in cases:
        try:
            got = your_function(*_clone(case.args))
        except Exception as err:  # the reader's code may raise anything
            print(f"{title}: case '{case.name}' raised {type(err).__name__}: {err}")
            print(f"  input: {_show(case.args)}")
            return False
        try:
            expected = case.expected
            if isinstance(expected, torch.Tensor):
                got = torch.as_tensor(got)
                if got.shape != expected.shape:
                    raise AssertionError(f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}")
                torch.testing.assert_close(got.to(expected.dtype), expected, rtol=rtol, atol=atol)
            elif isinstance(expected, dict):
                if not isinstance(got, dict) or set(got) != set(expected):
                    raise AssertionError(f"expected a dict with keys {sorted(expected)}")
                for k in expected:
                    torch.testing.assert_close(torch.as_tensor(got[k]).to(expected[k].dtype), expected[k],
                                               rtol=rtol, atol=atol)
            elif isinstance(expected, float):
                if abs(float(got) - expected) > atol + rtol * abs(expected):
                    raise AssertionError("values differ")
            elif got != expected:
                raise AssertionError("values differ")
        except (AssertionError, TypeError, ValueError) as err:
            print(f"{title}: case '{case.name}' failed: {str(err).splitlines()[0]}")
            print(f"  input:    {_show(case.args)}")
            print(f"  expected: {_show(case.expected)}")
            print(f"  received: {_show(got)}")
            return False
    print(f"{title}: all {len(cases)} cases passed.")
    return True


def check_fedavg(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(deltas: Tensor[m, d], weights: Tensor[m]) -> Tensor[d]``,
    FedAvg's weighted mean ``sum_i p_i Delta_i`` with ``p = weights / weights.sum()``."""
    from .aggregators import fedavg

    g = torch.Generator().manual_seed(seed)
    inputs = [
        ("random, 5 clients", torch.randn(5, 7, generator=g), torch.rand(5, generator=g) + 0.1),
        ("one client", torch.randn(1, 4, generator=g), torch.tensor([3.0])),
        ("sample counts as weights", torch.randn(4, 3, generator=g), torch.tensor([10.0, 200.0, 1.0, 35.0])),
        ("a client with weight zero", torch.randn(3, 5, generator=g), torch.tensor([0.0, 2.0, 1.0])),
        ("identical updates", torch.ones(6, 2), torch.rand(6, generator=g) + 0.5),
        ("double precision", torch.randn(8, 11, generator=g, dtype=torch.float64),
         torch.rand(8, generator=g, dtype=torch.float64) + 0.1),
    ]
    cases = [Case(name, (d, w), fedavg(d, w)) for name, d, w in inputs]
    return run_cases("check_fedavg", your_function, cases)

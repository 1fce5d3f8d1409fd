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

import base64
import contextlib
import html
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "Case",
    "run_cases",
    "check_fedavg",
    "check_fedvg_weights",
    "check_oui",
    "check_beta_moments",
    "check_pca_fingerprint",
    "check_craft_direction",
    "collapsed_output",
]


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


def run_cases(
    title: str, your_function: Callable, cases: Sequence[Case], rtol: float = 1e-5, atol: float = 1e-6
) -> bool:
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
                    torch.testing.assert_close(
                        torch.as_tensor(got[k]).to(expected[k].dtype), expected[k], rtol=rtol, atol=atol
                    )
            elif isinstance(expected, float):
                if abs(float(got) - expected) > atol + rtol * abs(expected):
                    raise AssertionError("values differ")
            elif isinstance(expected, tuple):
                got = tuple(float(v) for v in got)
                if len(got) != len(expected) or any(abs(g - e) > atol + rtol * abs(e) for g, e in zip(got, expected)):
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
        (
            "double precision",
            torch.randn(8, 11, generator=g, dtype=torch.float64),
            torch.rand(8, generator=g, dtype=torch.float64) + 0.1,
        ),
    ]
    cases = [Case(name, (d, w), fedavg(d, w)) for name, d, w in inputs]
    return run_cases("check_fedavg", your_function, cases)


def check_fedvg_weights(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(grad_norms: Tensor[m, L]) -> Tensor[m]``: FedVG's client weights
    ``s_k = (1 / (G_k + eps)) / sum_j 1 / (G_j + eps)`` with ``G_k = sum_l grad_norms[k, l]``
    and ``eps = 1e-8``. One case has a client whose gradient is exactly zero: a solution
    without ``eps`` divides by zero there and fails."""
    from .aggregators import fedvg_weights

    g = torch.Generator().manual_seed(seed)
    inputs = [
        ("random, 6 clients x 4 tensors", torch.rand(6, 4, generator=g) * 3),
        ("one client", torch.rand(1, 5, generator=g) + 0.1),
        ("equal norms give uniform weights", torch.full((5, 3), 0.7)),
        ("one client with a tiny gradient", torch.tensor([[1e-9, 0.0], [1.0, 2.0], [0.5, 0.5]])),
        # without eps, 1 / G_k is infinite here and the weights come out NaN
        ("one client with an exactly zero gradient (needs eps)", torch.tensor([[0.0, 0.0], [1.0, 2.0], [0.5, 0.5]])),
        ("double precision", torch.rand(7, 9, generator=g, dtype=torch.float64)),
    ]
    cases = [Case(name, (x,), fedvg_weights(x)) for name, x in inputs]
    return run_cases("check_fedvg_weights", your_function, cases)


def check_oui(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(preactivations: Tensor[B, d]) -> float``: the OUI,
    ``mean_j min(s_j, B - s_j) / floor(B / 2)`` with ``s_j`` the number of samples whose
    pre-activation of unit j is > 0, clipped to [0, 1]. Exact zeros count as *off*
    (a ReLU passes nothing there): two cases hold exact zeros, so a solution that tests
    ``z >= 0`` fails."""
    from .signals import oui

    g = torch.Generator().manual_seed(seed)
    half = torch.cat([torch.ones(16, 8), -torch.ones(16, 8)])
    zeros_and_negatives = torch.cat([torch.zeros(5, 6), -torch.rand(5, 6, generator=g) - 0.1])
    relu_like = torch.relu(torch.randn(12, 9, generator=g))  # about half the entries exactly 0
    inputs = [
        ("random Gaussian, B=32, d=64", torch.randn(32, 64, generator=g)),
        ("every unit splits the batch in half (OUI = 1)", half),
        ("every unit always on (OUI = 0)", torch.rand(32, 10, generator=g) + 0.1),
        ("every unit always off, zeros count as off", torch.zeros(8, 5)),
        ("odd batch size B=7", torch.randn(7, 12, generator=g)),
        ("a single unit", torch.randn(10, 1, generator=g)),
        ("half the samples exactly 0, half negative: zeros are off (OUI = 0)", zeros_and_negatives),
        ("post-ReLU values with exact zeros", relu_like),
    ]
    cases = [Case(name, (z,), float(oui(z))) for name, z in inputs]
    return run_cases("check_oui", your_function, cases)


def check_beta_moments(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(mean: float, var: float) -> (alpha, beta)``: the Beta
    distribution with that mean and variance (method of moments)."""
    import numpy as np

    from .aggregators import beta_moments

    rng = np.random.default_rng(seed)
    sample = rng.beta(6.10, 15.94, size=20)
    inputs = [
        ("Beta(2.5, 7.5)'s moments", 0.25, 0.25 * 0.75 / 11),
        ("Beta(6.10, 15.94)'s moments", 6.10 / 22.04, (6.10 * 15.94) / (22.04**2 * 23.04)),
        ("sample moments of 20 OUI values (ddof = 1)", float(sample.mean()), float(sample.var(ddof=1))),
        ("a symmetric Beta(3, 3)", 0.5, 0.25 / 7),
    ]
    cases = [Case(name, (m, v), tuple(float(x) for x in beta_moments(m, v))) for name, m, v in inputs]
    return run_cases("check_beta_moments", your_function, cases, rtol=1e-6, atol=1e-8)


def check_pca_fingerprint(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(features: Tensor[n, p], labels: Tensor[n], num_classes: int,
    num_eigenvalues: int) -> Tensor[num_eigenvalues]``: the largest eigenvalues of the sample
    covariance (ddof = 1) of ``[features, onehot(labels)]``, descending, divided by their
    total (the trace), zero-padded to ``num_eigenvalues``."""
    from .signals import pca_fingerprint

    g = torch.Generator().manual_seed(seed)
    inputs = [
        (
            "random, n=40, p=6, 3 classes, l=5",
            torch.rand(40, 6, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (40,), generator=g),
            3,
            5,
        ),
        (
            "more eigenvalues asked than exist: zero padding",
            torch.rand(30, 2, generator=g, dtype=torch.float64),
            torch.randint(0, 2, (30,), generator=g),
            2,
            8,
        ),
        (
            "fewer samples than dimensions (n=5, p=20)",
            torch.rand(5, 20, generator=g, dtype=torch.float64),
            torch.tensor([0, 1, 2, 1, 0]),
            3,
            6,
        ),
        (
            "one class only",
            torch.rand(25, 4, generator=g, dtype=torch.float64),
            torch.zeros(25, dtype=torch.long),
            2,
            4,
        ),
    ]
    cases = [Case(name, (x, y, c, l), pca_fingerprint(x, y, c, l)) for name, x, y, c, l in inputs]
    return run_cases("check_pca_fingerprint", your_function, cases, rtol=1e-6, atol=1e-9)


def check_craft_direction(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(pseudo_grads: Tensor[m, d], rho: Tensor[m], reference: Tensor[d])
    -> Tensor[d]``: CRAFT's minimum-norm correction ``g = g_hat + U^+ (rho - U g_hat)``, with
    ``U`` the row-normalised pseudo-gradients, ``rho`` normalised to sum to one and
    ``g_hat = reference / ||reference||`` (``g_hat = 0`` for a zero reference): both
    normalisations are part of the answer, and cases with ``rho`` summing to more than one and
    with a reference of length other than one fail without them. The cases
    have full-rank ``U``, at least two clients and no zero updates (the special rules for
    zero updates and a single client are not checked)."""
    from .aggregators import craft_direction

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    conflicting = torch.tensor([[1.0, 0.2], [-0.6, 1.0]], dtype=dt)
    inputs = [
        (
            "two conflicting clients in 2-D, no reference",
            conflicting,
            torch.tensor([0.5, 0.5], dtype=dt),
            torch.zeros(2, dtype=dt),
        ),
        (
            "random, m=4, d=10, with a reference",
            torch.randn(4, 10, generator=g, dtype=dt),
            torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dt),
            torch.randn(10, generator=g, dtype=dt),
        ),
        (
            "a reference that already satisfies the constraints",
            torch.eye(3, dtype=dt) * torch.tensor([[2.0], [0.5], [1.0]], dtype=dt),
            torch.ones(3, dtype=dt),
            torch.ones(3, dtype=dt),
        ),
        (
            "two clients in d=6, with a reference",
            torch.randn(2, 6, generator=g, dtype=dt),
            torch.tensor([0.3, 0.7], dtype=dt),
            torch.randn(6, generator=g, dtype=dt),
        ),
        (
            "m=8 in d=50, sample sizes as rho",
            torch.randn(8, 50, generator=g, dtype=dt),
            torch.randint(1, 100, (8,), generator=g).to(dt),
            torch.randn(50, generator=g, dtype=dt),
        ),
    ]
    cases = [Case(name, (u, r, ref), craft_direction(u, r, ref)) for name, u, r, ref in inputs]
    return run_cases("check_craft_direction", your_function, cases, rtol=1e-6, atol=1e-9)


@contextlib.contextmanager
def collapsed_output(summary: str = "Output") -> Iterator[None]:
    """Show what a block prints or displays inside one collapsed ``<details>`` block, closed until opened.

    The solution cells of the book's reader's copies run inside it: a solution's output is part of the
    solution, and neither JupyterLab (which shows a hidden cell's outputs again once the cell runs) nor
    Colab hides the output of a collapsed cell. Printed text, warnings and displayed objects (figures
    included) are collected while the block runs and shown when it ends, also when it raises (the
    error itself is shown as usual). Outside IPython the output is shown as usual.

    Args:
        summary: the line shown while the block is closed.

    Yields:
        Nothing; use it as ``with collapsed_output("Output of the solution"): ...``.
    """
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
        from IPython.utils.capture import capture_output
    except ImportError:  # pragma: no cover - IPython comes with Jupyter
        yield
        return
    if get_ipython() is None:
        yield
        return
    capture = capture_output()
    captured = capture.__enter__()
    try:
        yield
    finally:
        capture.__exit__(None, None, None)
        body = [f"<pre>{html.escape(text)}</pre>" for text in (captured.stdout, captured.stderr) if text]
        for output in captured.outputs:
            body.append(_as_html(output.data))
        display(HTML(f"<details><summary>{html.escape(summary)}</summary>{''.join(body)}</details>"))


def _as_html(data: dict) -> str:
    """One displayed object (its MIME bundle) as HTML: an image, its own HTML, or its text."""
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            raw = data[mime]
            encoded = base64.b64encode(raw).decode("ascii") if isinstance(raw, bytes) else raw
            return f'<img src="data:{mime};base64,{encoded}">'
    if "text/html" in data:
        return data["text/html"]
    return f"<pre>{html.escape(str(data.get('text/plain', '')))}</pre>"


def check_scaffold_control_update(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(client_controls: Tensor[m, d], server_control: Tensor[d], deltas: Tensor[m, d],
    local_steps: Tensor[m], lr: float) -> Tensor[m, d]``: SCAFFOLD's option-II control variates
    ``c_i+ = c_i - c + (x - y_i) / (K_i lr)``, where ``deltas[i] = y_i - x``."""
    from .aggregators import scaffold_control_update

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    inputs = [
        (
            "random, 5 clients, different step counts",
            torch.randn(5, 7, generator=g, dtype=dt),
            torch.randn(7, generator=g, dtype=dt),
            torch.randn(5, 7, generator=g, dtype=dt),
            torch.tensor([1, 3, 5, 10, 2]),
            0.05,
        ),
        (
            "first round: all controls zero",
            torch.zeros(4, 3, dtype=dt),
            torch.zeros(3, dtype=dt),
            torch.randn(4, 3, generator=g, dtype=dt),
            torch.full((4,), 5),
            0.1,
        ),
        (
            "one client",
            torch.randn(1, 4, generator=g, dtype=dt),
            torch.randn(4, generator=g, dtype=dt),
            torch.randn(1, 4, generator=g, dtype=dt),
            torch.tensor([8]),
            0.01,
        ),
        (
            "a client that did not move",
            torch.randn(3, 2, generator=g, dtype=dt),
            torch.randn(2, generator=g, dtype=dt),
            torch.tensor([[0.0, 0.0], [0.3, -0.1], [1.0, 2.0]], dtype=dt),
            torch.tensor([4, 4, 4]),
            0.2,
        ),
    ]
    cases = [
        Case(name, (ci, c, d, k, lr), scaffold_control_update(ci, c, d, k, lr)) for name, ci, c, d, k, lr in inputs
    ]
    return run_cases("check_scaffold_control_update", your_function, cases, rtol=1e-6, atol=1e-9)


def check_fednova(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(deltas: Tensor[m, d], local_steps: Tensor[m], weights: Tensor[m]) -> Tensor[d]``:
    FedNova's direction for plain local SGD, ``tau_eff * sum_i p_i deltas_i / tau_i`` with
    ``p = weights / weights.sum()`` and ``tau_eff = sum_i p_i tau_i``."""
    from .aggregators import fednova_aggregate

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    inputs = [
        (
            "random, 5 clients, different step counts",
            torch.randn(5, 6, generator=g, dtype=dt),
            torch.tensor([1, 2, 5, 10, 20]),
            torch.rand(5, generator=g, dtype=dt) + 0.1,
        ),
        (
            "equal step counts: FedAvg",
            torch.randn(4, 3, generator=g, dtype=dt),
            torch.full((4,), 5),
            torch.tensor([10.0, 20.0, 30.0, 40.0], dtype=dt),
        ),
        ("one client", torch.randn(1, 5, generator=g, dtype=dt), torch.tensor([7]), torch.tensor([3.0], dtype=dt)),
        (
            "a client with weight zero",
            torch.randn(3, 4, generator=g, dtype=dt),
            torch.tensor([2, 50, 8]),
            torch.tensor([1.0, 0.0, 2.0], dtype=dt),
        ),
        (
            "sample counts as weights, many steps",
            torch.randn(6, 9, generator=g, dtype=dt),
            torch.tensor([100, 3, 40, 1, 7, 64]),
            torch.tensor([500.0, 20.0, 80.0, 5.0, 60.0, 300.0], dtype=dt),
        ),
    ]
    cases = [Case(name, (d, k, w), fednova_aggregate(d, k, w)) for name, d, k, w in inputs]
    return run_cases("check_fednova", your_function, cases, rtol=1e-6, atol=1e-9)


__all__ += ["check_scaffold_control_update", "check_fednova"]

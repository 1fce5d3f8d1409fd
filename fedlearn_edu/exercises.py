"""Checkers for the book's implementation exercises (and for grading coursework).

Each ``check_<name>(your_function)`` runs the reader's function against the package on
random and edge-case inputs, and prints either a pass or the **first** failing input: what
that case tests, the expected and the received values, and a hint at the usual mistake
(which one the received values match, when they match one). It returns ``True`` on a pass,
``False`` otherwise, so an instructor can use it in an autograder::

    >>> import torch
    >>> from fedlearn_edu.exercises import check_fedavg
    >>> def my_fedavg(deltas, weights):
    ...     p = weights / weights.sum()
    ...     return (p[:, None] * deltas).sum(0)
    >>> check_fedavg(my_fedavg)
    check_fedavg: all 6 cases passed.
    True

:data:`CHECKERS` lists every checker with what it checks (the README's list is that one).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import gc
import html
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "CHECKERS",
    "Case",
    "Mistake",
    "run_cases",
    "CaseResult",
    "recorded_cases",
    "check_fedavg",
    "check_fedvg_weights",
    "check_oui",
    "check_beta_moments",
    "check_pca_fingerprint",
    "check_personal_model",
    "check_craft_direction",
    "check_scaffold_control_update",
    "check_fednova",
    "check_fair_comparison",
    "check_interval_reading",
    "check_holm",
    "check_bh",
    "check_trimmed_mean",
    "check_krum",
    "check_clip_and_noise",
    "collapsed_output",
]

CHECKERS = {
    # name: what it checks (the chapter whose exercise uses it)
    "check_fedavg": "FedAvg's weighted mean of the clients' updates (chapter 1)",
    "check_scaffold_control_update": "SCAFFOLD's option-II update of the clients' control variates (chapter 2)",
    "check_fednova": "FedNova's normalised aggregate for plain local SGD (chapter 2)",
    "check_craft_direction": (
        "CRAFT's minimum-norm conflict-free direction, rank-deficient cases (duplicate clients) included (chapter 4)"
    ),
    "check_fedvg_weights": "FedVG's client weights from the validation-gradient norms (chapter 5)",
    "check_oui": "the OUI of a layer: how evenly each unit's activity splits the batch (chapter 6)",
    "check_beta_moments": "the Beta distribution with a given mean and variance, by the method of moments (chapter 6)",
    "check_pca_fingerprint": "a client's PCA fingerprint: its top covariance eigenvalues over their total (chapter 7)",
    "check_personal_model": (
        "reading a Flower node's personal model: the node of a partition found by its node_config, "
        "the client axis dropped (chapter 8)"
    ),
    "check_fair_comparison": (
        "whether a comparison plan is fair: disjoint tuning and evaluation seeds, >= 3 different evaluation seeds, "
        "every method's server step tuned (chapter 9)"
    ),
    "check_interval_reading": "reading a paired difference and its interval: better, worse or inconclusive (chapter 9)",
    "check_holm": "Holm's step-down adjusted p-values, for comparing several methods with one baseline (chapter 9)",
    "check_bh": "Benjamini-Hochberg's adjusted p-values (q-values), the false discovery rate's step-up (chapter 9)",
    "check_trimmed_mean": ("the coordinate-wise trimmed mean, floor(beta m) values cut at each end (chapter 10)"),
    "check_krum": (
        "Krum's pick: the update with the least sum of squared distances to its m - f - 2 nearest others (chapter 10)"
    ),
    "check_clip_and_noise": (
        "DP-FedAvg's noisy mean: clip each update's norm to C, add z C xi, divide by the fixed D (chapter 10)"
    ),
}
"""Every checker of this module and what it checks, in the book's order."""


@dataclass
class Case:
    """One input for a checker.

    What it tests, positional arguments, the expected output and, optionally, the mistake it
    is there to catch (printed as a hint when the case fails).
    """

    name: str
    args: tuple
    expected: object
    hint: str = ""


@dataclass
class Mistake:
    """A usual wrong answer: what it is, and a function computing it from a case's arguments.

    When a solution fails a case and its output equals this function's, the checker says so.
    """

    description: str
    function: Callable


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return x


def _same(x, y) -> bool:
    """Whether ``x`` still equals its copy ``y`` (what :func:`_clone` copies, compared exactly)."""
    if isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and x.shape == y.shape and bool(torch.equal(x, y))
    if isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=True))
    if isinstance(y, dict):
        return isinstance(x, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in y)
    if isinstance(y, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return x is y or x == y


def _show(x, limit: int = 400) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit] + " ..."


def _compare(got, expected, rtol: float, atol: float):
    """``got`` as compared (a tensor for a tensor); raises AssertionError, TypeError or ValueError if it differs."""
    if isinstance(expected, torch.Tensor):
        got = torch.as_tensor(got)
        if got.shape != expected.shape:
            raise AssertionError(f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}")
        torch.testing.assert_close(got.to(expected.dtype), expected, rtol=rtol, atol=atol)
    elif isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            raise AssertionError(f"expected a dict with keys {sorted(expected)}")
        for k in expected:
            torch.testing.assert_close(torch.as_tensor(got[k]).to(expected[k].dtype), expected[k], rtol=rtol, atol=atol)
    elif isinstance(expected, float):
        if abs(float(got) - expected) > atol + rtol * abs(expected):
            raise AssertionError("values differ")
    elif isinstance(expected, tuple):
        got = tuple(float(v) for v in got)
        if len(got) != len(expected) or any(abs(g - e) > atol + rtol * abs(e) for g, e in zip(got, expected)):
            raise AssertionError("values differ")
    elif got != expected:
        raise AssertionError("values differ")
    return got


def _gives(mistake: Mistake, case: Case, got, rtol: float, atol: float) -> bool | None:
    """Whether ``mistake`` gives ``got`` on ``case``; ``None`` when it does not apply to the case (raises)."""
    try:
        wrong = mistake.function(*_clone(case.args))
        if isinstance(case.expected, float):
            wrong = float(wrong)
        elif isinstance(case.expected, tuple):
            wrong = tuple(float(v) for v in wrong)
    except Exception:  # the mistake does not apply to this case
        return None
    try:
        _compare(got, wrong, rtol, atol)
    except Exception:  # it gives something else
        return False
    return True


def _matching_mistakes(
    got, case: Case, mistakes: Sequence[Mistake], rtol: float, atol: float, passed: Sequence[Case] = ()
) -> list[str]:
    """The mistakes that give ``got`` on ``case`` and also pass every case the solution passed.

    A mistake that fails a case the solution passed is not the solution's mistake, even when
    it gives the same wrong output on this case: naming it would misdiagnose.
    """
    return [
        mistake.description
        for mistake in mistakes
        if _gives(mistake, case, got, rtol, atol)
        and all(_gives(mistake, earlier, earlier.expected, rtol, atol) is not False for earlier in passed)
    ]


def _print_hints(
    case: Case,
    got,
    mistakes: Sequence[Mistake],
    rtol: float,
    atol: float,
    passed: Sequence[Case] = (),
    answers: Sequence | None = None,
) -> None:
    outside = got is not None and answers is not None and not any(_same(got, a) for a in answers)
    if outside:
        to_bool = " (bool(...) makes one of a set or a number)" if all(isinstance(a, bool) for a in answers) else ""
        print(f"  hint: the answer must be one of {', '.join(repr(a) for a in answers)}{to_bool}; {got!r} is not")
    matched = [] if got is None else _matching_mistakes(got, case, mistakes, rtol, atol, passed)
    for description in matched:
        print(f"  hint: your output is what {description} gives")
    if case.hint and not matched and not outside:
        print(f"  hint: {case.hint}")


def run_cases(
    title: str,
    your_function: Callable,
    cases: Sequence[Case],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    mistakes: Sequence[Mistake] = (),
    inputs_unchanged: bool = False,
    answers: Sequence | None = None,
) -> bool:
    """Run ``your_function(*case.args)`` for each case; print a pass or the first failure.

    A failure names the case (what it tests), shows its input and the expected and received values,
    and hints at the mistake: the :class:`Mistake` whose output the received one equals (among
    those that pass the cases the solution passed), else the case's own ``hint``.

    Args:
        title: the checker's name, printed with the result.
        your_function: the reader's implementation.
        cases: the inputs and expected outputs.
        rtol: relative tolerance of the comparison.
        atol: absolute tolerance of the comparison.
        mistakes: known wrong implementations, recognised by their output.
        inputs_unchanged: also fail a case whose arguments (lists, arrays, tensors) the function
            changed in place, even when its output is right.
        answers: the only outputs allowed (e.g. ``(True, False)``), for a checker whose answer
            is one of a few values; an output outside them is named as such.

    Returns:
        ``True`` when every case passes, ``False`` at the first failure.
    """
    recorder = _RECORDER.get()
    passed: list[Case] = []
    for case in cases:
        if recorder is None:
            ok, _ = _run_case(title, your_function, case, rtol, atol, mistakes, inputs_unchanged, answers, passed)
            if not ok:
                return False
        else:  # grading: every case runs, each one's printout becomes its message
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                ok, raised = _run_case(
                    title, your_function, case, rtol, atol, mistakes, inputs_unchanged, answers, passed
                )
            recorder.append(CaseResult(title, case.name, ok, printed.getvalue().strip(), raised))
        if ok:
            passed.append(case)
    if recorder is None:
        print(f"{title}: all {len(cases)} cases passed.")
    return len(passed) == len(cases)


def _run_case(title, your_function, case, rtol, atol, mistakes, inputs_unchanged, answers, passed) -> tuple[bool, str]:
    """One case of :func:`run_cases`: whether it passed (printing why not), and what the function raised (or '')."""
    args = _clone(case.args)
    try:
        got = your_function(*args)
    except Exception as err:  # the reader's code may raise anything
        print(f"{title}: case '{case.name}' raised {type(err).__name__}: {err}")
        print(f"  input: {_show(case.args)}")
        if isinstance(err, NotImplementedError):  # a problem set's stub (python -m fedlearn_edu assign)
            print("  hint: not implemented yet: replace `raise NotImplementedError()` with your code")
        else:
            _print_hints(case, None, mistakes, rtol, atol)
        return False, type(err).__name__
    try:
        got = _compare(got, case.expected, rtol, atol)
    except (AssertionError, TypeError, ValueError) as err:
        print(f"{title}: case '{case.name}' failed: {str(err).splitlines()[0]}")
        print(f"  input:    {_show(case.args)}")
        print(f"  expected: {_show(case.expected)}")
        print(f"  received: {_show(got)}")
        _print_hints(case, got, mistakes, rtol, atol, passed, answers)
        return False, ""
    if inputs_unchanged and not _same(args, case.args):
        print(f"{title}: case '{case.name}' failed: your function changed its input in place")
        print(f"  input:      {_show(case.args)}")
        print(f"  after call: {_show(args)}")
        print(
            "  hint: the output is right, but the caller's data must stay as it was: work on a copy "
            "(np.array(x, dtype=float), sorted(x), x.clone()), never x.sort() or x[...] = ... on the input"
        )
        return False, ""
    return True, ""


@dataclass
class CaseResult:
    """One case a checker ran inside :func:`recorded_cases`.

    Attributes:
        checker: the checker's name (``"check_fedavg"``).
        case: what the case tests (its name).
        passed: whether the function's output matched.
        message: what the checker would print for it ('' on a pass): the failure and its hint.
        raised: the name of the exception the function raised ('' when it returned).
    """

    checker: str
    case: str
    passed: bool
    message: str = ""
    raised: str = ""


_RECORDER: contextvars.ContextVar[list[CaseResult] | None] = contextvars.ContextVar("fedlearn_cases", default=None)


@contextlib.contextmanager
def recorded_cases() -> Iterator[list[CaseResult]]:
    """Inside the block, every checker runs **all** its cases, prints nothing, and records each one.

    This is how coursework is graded (:mod:`fedlearn_edu.coursework`): partial credit per case,
    and hidden cases by calling the checker with another ``seed`` (its random inputs change,
    so an answer that hard-codes the public cases fails them). Outside the block the checkers
    behave as always: they stop at the first failure and print it.

    Yields:
        The list the :class:`CaseResult` of every case is appended to, in order.

    Example:
        >>> from fedlearn_edu.exercises import check_fedavg, recorded_cases
        >>> with recorded_cases() as results:
        ...     check_fedavg(lambda d, w: d.mean(0))
        False
        >>> sum(r.passed for r in results), len(results)
        (2, 6)
    """
    results: list[CaseResult] = []
    token = _RECORDER.set(results)
    try:
        yield results
    finally:
        _RECORDER.reset(token)


def check_fedavg(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against FedAvg's weighted mean.

    It must be ``your_function(deltas: Tensor[m, d], weights: Tensor[m]) -> Tensor[d]``,
    FedAvg's weighted mean ``sum_i p_i Delta_i`` with ``p = weights / weights.sum()``.

    Args:
        your_function: the reader's FedAvg's weighted mean, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import fedavg

    g = torch.Generator().manual_seed(seed)
    normalise = "divide the weights by their sum: p = weights / weights.sum()"
    inputs = [
        ("unequal weights, 5 clients", torch.randn(5, 7, generator=g), torch.rand(5, generator=g) + 0.1, normalise),
        (
            "one client of weight 3: the result is its update",
            torch.randn(1, 4, generator=g),
            torch.tensor([3.0]),
            normalise,
        ),
        (
            "sample counts as weights (summing to 246, not 1)",
            torch.randn(4, 3, generator=g),
            torch.tensor([10.0, 200.0, 1.0, 35.0]),
            normalise,
        ),
        (
            "a client with weight zero does not count",
            torch.randn(3, 5, generator=g),
            torch.tensor([0.0, 2.0, 1.0]),
            "a weighted mean, not the plain mean over clients",
        ),
        (
            "identical updates: any weights give that update",
            torch.ones(6, 2),
            torch.rand(6, generator=g) + 0.5,
            normalise,
        ),
        (
            "float64 inputs, 8 clients",
            torch.randn(8, 11, generator=g, dtype=torch.float64),
            torch.rand(8, generator=g, dtype=torch.float64) + 0.1,
            "",
        ),
    ]
    cases = [Case(name, (d, w), fedavg(d, w), hint) for name, d, w, hint in inputs]
    mistakes = [
        Mistake("unnormalised weights (sum_i w_i Delta_i, without dividing by sum_j w_j)", lambda d, w: w @ d),
        Mistake("the plain mean over clients (the weights ignored)", lambda d, w: d.mean(0)),
    ]
    return run_cases("check_fedavg", your_function, cases, mistakes=mistakes)


def check_fedvg_weights(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against FedVG's client weights.

    It must be ``your_function(grad_norms: Tensor[m, L]) -> Tensor[m]``: FedVG's client weights
    ``s_k = (1 / (G_k + eps)) / sum_j 1 / (G_j + eps)`` with ``G_k = sum_l grad_norms[k, l]``
    and ``eps = 1e-8``. One case has a client whose gradient is exactly zero: a solution
    without ``eps`` divides by zero there and fails.

    Args:
        your_function: the reader's FedVG's client weights, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import fedvg_weights

    g = torch.Generator().manual_seed(seed)
    inverse = "a small gradient norm G_k gets a large weight: s_k is proportional to 1 / (G_k + eps)"
    inputs = [
        ("unequal norms, 6 clients x 4 tensors", torch.rand(6, 4, generator=g) * 3, inverse),
        ("one client: weight 1", torch.rand(1, 5, generator=g) + 0.1, "the weights sum to one"),
        ("equal norms give uniform weights", torch.full((5, 3), 0.7), "the weights sum to one"),
        (
            "one client with a tiny gradient (G = 1e-9): eps = 1e-8 bounds its weight",
            torch.tensor([[1e-9, 0.0], [1.0, 2.0], [0.5, 0.5]]),
            "add eps = 1e-8 to G_k before inverting: 1 / (G_k + eps)",
        ),
        # without eps, 1 / G_k is infinite here and the weights come out NaN
        (
            "one client with an exactly zero gradient (needs eps)",
            torch.tensor([[0.0, 0.0], [1.0, 2.0], [0.5, 0.5]]),
            "missing eps: 1 / G_k is infinite for a zero gradient; use 1 / (G_k + 1e-8)",
        ),
        ("float64 inputs, 7 clients x 9 tensors", torch.rand(7, 9, generator=g, dtype=torch.float64), inverse),
    ]
    cases = [Case(name, (x,), fedvg_weights(x), hint) for name, x, hint in inputs]
    mistakes = [
        Mistake("weights proportional to G_k (not to 1 / G_k)", lambda x: x.sum(1) / x.sum(1).sum()),
        Mistake("1 / (G_k + eps) without normalising the weights to sum to one", lambda x: 1.0 / (x.sum(1) + 1e-8)),
        Mistake(
            "the norms' mean over tensors instead of their sum (G_k = mean_l)",
            lambda x: fedvg_weights(x.mean(1, keepdim=True)),
        ),
    ]
    return run_cases("check_fedvg_weights", your_function, cases, mistakes=mistakes)


def check_oui(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against the OUI.

    It must be ``your_function(preactivations: Tensor[B, d]) -> float``: the OUI,
    ``mean_j min(s_j, B - s_j) / floor(B / 2)`` with ``s_j`` the number of samples whose
    pre-activation of unit j is > 0, clipped to [0, 1]. Exact zeros count as *off*
    (a ReLU passes nothing there): two cases hold exact zeros, so a solution that tests
    ``z >= 0`` fails.

    Args:
        your_function: the reader's OUI, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .signals import oui

    g = torch.Generator().manual_seed(seed)
    half = torch.cat([torch.ones(16, 8), -torch.ones(16, 8)])
    zeros_and_negatives = torch.cat([torch.zeros(5, 6), -torch.rand(5, 6, generator=g) - 0.1])
    relu_like = torch.relu(torch.randn(12, 9, generator=g))  # about half the entries exactly 0
    zeros_off = "an exact zero is off (a ReLU passes nothing there): count z > 0, not z >= 0"
    inputs = [
        ("Gaussian pre-activations, B=32, d=64", torch.randn(32, 64, generator=g), ""),
        ("every unit splits the batch in half (OUI = 1)", half, "divide min(s_j, B - s_j) by floor(B / 2)"),
        ("every unit always on (OUI = 0)", torch.rand(32, 10, generator=g) + 0.1, "min(s_j, B - s_j), not s_j"),
        ("every unit always off, zeros count as off", torch.zeros(8, 5), zeros_off),
        ("odd batch size B=7", torch.randn(7, 12, generator=g), "divide by floor(B / 2) = 3 for B = 7, not B / 2"),
        ("a single unit", torch.randn(10, 1, generator=g), "the mean over units of a [B, d] input"),
        ("half the samples exactly 0, half negative: zeros are off (OUI = 0)", zeros_and_negatives, zeros_off),
        ("post-ReLU values with exact zeros", relu_like, zeros_off),
    ]
    cases = [Case(name, (z,), float(oui(z)), hint) for name, z, hint in inputs]

    def _oui(z, active, denominator):
        s = active(z).sum(0).double()
        return torch.minimum(s, z.shape[0] - s).mean() / denominator(z.shape[0])

    mistakes = [
        Mistake("counting exact zeros as on (z >= 0)", lambda z: _oui(z, lambda v: v >= 0, lambda b: b // 2)),
        Mistake("dividing by B / 2 instead of floor(B / 2)", lambda z: _oui(z, lambda v: v > 0, lambda b: b / 2)),
    ]
    return run_cases("check_oui", your_function, cases, mistakes=mistakes)


def check_beta_moments(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against the Beta distribution's method of moments.

    It must be ``your_function(mean: float, var: float) -> (alpha, beta)``: the Beta
    distribution with that mean and variance (method of moments).

    Args:
        your_function: the reader's method of moments, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import beta_moments

    rng = np.random.default_rng(seed)
    sample = rng.beta(6.10, 15.94, size=20)
    formula = "c = mean (1 - mean) / var - 1, then alpha = mean c and beta = (1 - mean) c"
    inputs = [
        ("Beta(2.5, 7.5)'s mean and variance give (2.5, 7.5)", 0.25, 0.25 * 0.75 / 11),
        ("Beta(6.10, 15.94)'s mean and variance give (6.10, 15.94)", 6.10 / 22.04, (6.10 * 15.94) / (22.04**2 * 23.04)),
        ("sample moments of 20 OUI values (ddof = 1)", float(sample.mean()), float(sample.var(ddof=1))),
        ("a symmetric Beta(3, 3): alpha = beta", 0.5, 0.25 / 7),
    ]
    cases = [Case(name, (m, v), tuple(float(x) for x in beta_moments(m, v)), formula) for name, m, v in inputs]
    mistakes = [
        Mistake("alpha and beta swapped", lambda m, v: tuple(reversed(beta_moments(m, v)))),
        Mistake("c = mean (1 - mean) / var, without the - 1", lambda m, v: (m * m * (1 - m) / v, (1 - m) ** 2 * m / v)),
    ]
    return run_cases("check_beta_moments", your_function, cases, rtol=1e-6, atol=1e-8, mistakes=mistakes)


def check_pca_fingerprint(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against the PCA fingerprint.

    It must be ``your_function(features: Tensor[n, p], labels: Tensor[n], num_classes: int,
    num_eigenvalues: int) -> Tensor[num_eigenvalues]``: the largest eigenvalues of the sample
    covariance (ddof = 1) of ``[features, onehot(labels)]``, descending, divided by their
    total (the trace), zero-padded to ``num_eigenvalues``.

    Args:
        your_function: the reader's PCA fingerprint, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .signals import pca_fingerprint

    g = torch.Generator().manual_seed(seed)
    inputs = [
        (
            "40 samples, 6 features, 3 classes, 5 eigenvalues",
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
    recipe = (
        "center the columns of [features, onehot(labels)], take the eigenvalues of their covariance "
        "(ddof = 1) in descending order and divide them by their total (the trace)"
    )
    hints = {
        "40 samples, 6 features, 3 classes, 5 eigenvalues": recipe,
        "more eigenvalues asked than exist: zero padding": "pad with zeros to num_eigenvalues",
        "fewer samples than dimensions (n=5, p=20)": "eigenvalues of the (p + C) x (p + C) covariance, clipped at 0",
        "one class only": "the one-hot block is constant: it adds zero eigenvalues",
    }
    cases = [Case(name, (x, y, c, l), pca_fingerprint(x, y, c, l), hints[name]) for name, x, y, c, l in inputs]

    def _eigenvalues(x, y, c, l, ddof=1, scale="trace", center=True, labels=True, ascending=False, root=False):
        a = torch.cat([x, torch.nn.functional.one_hot(y, c).to(x.dtype)], 1) if labels else x
        a = a - a.mean(0) if center else a
        ev = torch.linalg.eigvalsh(a.T @ a / (a.shape[0] - ddof)).flip(0).clamp(min=0)
        ev = ev.sqrt() if root else ev
        total = {"trace": ev.sum(), "kept": ev[:l].sum(), "largest": ev[0], None: 1.0}[scale]
        ev = ev.flip(0) / total if ascending else ev / total
        return torch.cat([ev, ev.new_zeros(max(0, l - ev.numel()))])[:l]

    mistakes = [
        Mistake(
            "eigenvalues not divided by their total (the trace)",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, scale=None),
        ),
        Mistake(
            "the population covariance (ddof = 0) and no division by the trace",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, ddof=0, scale=None),
        ),
        Mistake(
            "eigenvalues divided by the sum of the num_eigenvalues kept (divide by the trace, the sum of all of them)",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, scale="kept"),
        ),
        Mistake(
            "eigenvalues divided by the largest one (divide by the trace, their sum)",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, scale="largest"),
        ),
        Mistake(
            "A^T A / (n - 1) of uncentred columns (the covariance subtracts each column's mean first)",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, center=False),
        ),
        Mistake(
            "the features alone (the covariance is of [features, onehot(labels)], the labels included)",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, labels=False),
        ),
        Mistake(
            "the largest eigenvalues in ascending order (eigvalsh's order: flip them to descending)",
            lambda x, y, c, l: pca_fingerprint(x, y, c, l).flip(0),
        ),
        Mistake(
            "the smallest eigenvalues (eigvalsh sorts ascending: flip before keeping num_eigenvalues)",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, ascending=True),
        ),
        Mistake(
            "singular values s of the centred data (the covariance's eigenvalues are s^2 / (n - 1))",
            lambda x, y, c, l: _eigenvalues(x, y, c, l, root=True),
        ),
    ]
    return run_cases("check_pca_fingerprint", your_function, cases, rtol=1e-6, atol=1e-9, mistakes=mistakes)


def check_personal_model(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(contexts, partition_id) -> {name: Tensor}``: a node's personal model.

    ``contexts`` maps Flower node ids to the nodes' ``Context`` (as ``LocalGrid.contexts``
    does) after a Ditto run; the answer is the personal model ``v_i`` of the node whose
    ``node_config["partition-id"]`` is ``partition_id``, as ``{name: Tensor[...]}`` without the
    client axis: ``client_state(context)["personal"]`` holds the node's row, ``Tensor[1, ...]``.
    Node ids are Flower's own numbers (random 64-bit integers on real SuperNodes), not
    partition ids. Needs Flower (``pip install "flwr>=1.42,<2"``).

    Args:
        your_function: the reader's lookup, with the signature above.
        seed: seeds the random personal models of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from flwr.app import Context, RecordDict

    from .flower import CLIENT_STATE_KEY, client_state
    from .flower.records import state_to_arrays

    g = torch.Generator().manual_seed(seed)

    class NodeContexts(dict):
        """``{node_id: Context}`` shown by node ids and node configs (a Context's repr is pages of bytes)."""

        def __repr__(self) -> str:
            shown = (f"{k}: Context(node_config={c.node_config}, state=...)" for k, c in self.items())
            return "{" + ", ".join(shown) + "}"

    def nodes(node_ids, partitions, extra=False):
        """Contexts of nodes that trained: node_ids[k] holds partition partitions[k] and its row."""
        out = NodeContexts()
        for node_id, pid in zip(node_ids, partitions):
            state = {
                "personal": {"fc.weight": torch.randn(1, 3, 4, generator=g), "fc.bias": torch.randn(1, 3, generator=g)}
            }
            if extra:
                state["control"] = {
                    "fc.weight": torch.randn(1, 3, 4, generator=g),
                    "fc.bias": torch.randn(1, 3, generator=g),
                }
            out[node_id] = Context(
                run_id=1,
                node_id=node_id,
                node_config={"partition-id": pid, "num-partitions": len(partitions)},
                state=RecordDict({CLIENT_STATE_KEY: state_to_arrays(state)}),
                run_config={},
            )
        return out

    def reference(contexts, pid):
        (context,) = [c for c in contexts.values() if c.node_config["partition-id"] == pid]
        return {k: v[0] for k, v in client_state(context)["personal"].items()}

    by_config = "find the node whose node_config['partition-id'] is the partition: contexts are keyed by node id"
    recipe = (
        "client_state(context)['personal'] of the node whose node_config['partition-id'] is the partition "
        "(contexts are keyed by node id), each tensor without its client axis"
    )
    inputs = [
        (
            "three nodes numbered as LocalGrid numbers them (2, 3, 4), partition 1",
            nodes([2, 3, 4], [0, 1, 2]),
            1,
            recipe,
        ),
        (
            "real SuperNodes: random 64-bit node ids, partition 0",
            nodes([8_127_463_009_112_331, 511_022_874_330_918_772, 97_433_126_004_515], [2, 0, 1]),
            0,
            by_config,
        ),
        (
            "node ids 0, 1, 2 in another order than the partitions, partition 2",
            nodes([0, 1, 2], [1, 2, 0]),
            2,
            by_config,
        ),
        (
            "node ids in the dict's order unlike the partitions', partition 1",
            nodes([5, 3, 4, 2], [3, 1, 2, 0]),
            1,
            by_config,
        ),
        (
            "a state that holds a control variate beside the personal model, partition 0",
            nodes([2, 3], [0, 1], extra=True),
            0,
            "the personal model is client_state(context)['personal'], not the whole state",
        ),
    ]
    cases = [Case(name, (contexts, pid), reference(contexts, pid), hint) for name, contexts, pid, hint in inputs]

    def rows(context):
        return client_state(context)["personal"]

    mistakes = [
        Mistake(
            "the rows with their client axis, Tensor[1, ...] (drop it: t[0] for each tensor)",
            lambda c, pid: dict(rows(next(x for x in c.values() if x.node_config["partition-id"] == pid))),
        ),
        Mistake(
            "contexts[partition_id] (contexts are keyed by Flower node id, not by partition)",
            lambda c, pid: {k: v[0] for k, v in rows(c[pid]).items()},
        ),
        Mistake(
            "the partition_id-th context in the dict's order (node ids need not follow the partitions)",
            lambda c, pid: {k: v[0] for k, v in rows(list(c.values())[pid]).items()},
        ),
    ]
    return run_cases("check_personal_model", your_function, cases, mistakes=mistakes)


def check_craft_direction(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against CRAFT's minimum-norm correction.

    It must be ``your_function(pseudo_grads: Tensor[m, d], rho: Tensor[m], reference: Tensor[d])
    -> Tensor[d]``: CRAFT's minimum-norm correction ``g = g_hat + U^+ (rho - U g_hat)``, with
    ``U`` the row-normalised pseudo-gradients, ``rho`` normalised to sum to one and
    ``g_hat = reference / ||reference||`` (``g_hat = 0`` for a zero reference): both
    normalisations are part of the answer, and cases with ``rho`` summing to more than one and
    with a reference of length other than one fail without them. Three cases are
    **rank-deficient** (duplicate clients, as in chapter 4's exercise; opposite clients; more
    clients than dimensions): ``U U^T`` is singular there, so a solution through
    ``torch.linalg.solve`` fails them; ``U^+`` must be applied rank-safely (``torch.linalg.pinv``,
    ``torch.linalg.lstsq`` with an SVD driver, ``driver="gelsd"``, or an eigendecomposition of ``U U^T``
    with a cut-off, as the package
    does), which gives the least-squares compromise. The cases have at least two clients and no
    zero updates (the special rules for zero updates and a single client are not checked).

    Args:
        your_function: the reader's CRAFT direction, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
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
            "4 clients in d=10, rho summing to 10, a reference of length other than 1",
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
            "8 clients in d=50, sample sizes as rho",
            torch.randn(8, 50, generator=g, dtype=dt),
            torch.randint(1, 100, (8,), generator=g).to(dt),
            torch.randn(50, generator=g, dtype=dt),
        ),
    ]
    full_rank = [
        "normalise the rows (u_i = g_i / ||g_i||) and rho (rho / rho.sum())",
        "normalise rho to sum to one and the reference to unit length",
        "a reference that already satisfies U g = rho is returned as it is (after scaling to unit length)",
        "g = g_hat + U^+ (rho - U g_hat), with U's rows of unit length",
        "sample sizes as rho: divide rho by its sum",
    ]
    cases = [
        Case(name, (u, r, ref), craft_direction(u, r, ref), hint) for (name, u, r, ref), hint in zip(inputs, full_rank)
    ]
    duplicate = torch.randn(3, 5, generator=g, dtype=dt)
    duplicate[2] = duplicate[0]
    opposite = torch.randn(3, 4, generator=g, dtype=dt)
    opposite[1] = -2.0 * opposite[0]
    rank_deficient = [
        (
            "duplicate clients, u_3 = u_1 with unequal targets (rank-deficient Gram matrix U U^T)",
            duplicate,
            torch.tensor([0.2, 0.5, 0.3], dtype=dt),
            torch.randn(5, generator=g, dtype=dt),
        ),
        (
            "opposite clients, u_2 = -u_1 (rank-deficient Gram matrix U U^T)",
            opposite,
            torch.tensor([0.5, 0.3, 0.2], dtype=dt),
            torch.randn(4, generator=g, dtype=dt),
        ),
        (
            "more clients than dimensions, m=6 in d=3 (rank-deficient Gram matrix U U^T)",
            torch.randn(6, 3, generator=g, dtype=dt),
            torch.rand(6, generator=g, dtype=dt) + 0.1,
            torch.randn(3, generator=g, dtype=dt),
        ),
    ]
    rank_safe = (
        "U U^T is singular here: torch.linalg.solve fails (or returns huge values) on a rank-deficient Gram "
        "matrix. Use a rank-safe solve: torch.linalg.lstsq(U @ U.T, r, driver='gelsd').solution (an SVD driver: "
        "the default gelsy's rank cut-off is not always met by a float Gram matrix), torch.linalg.pinv(U) @ r, or an "
        "eigendecomposition of U U^T that drops the zero eigenvalues, as fedlearn_edu.aggregators.craft_direction"
    )
    cases += [Case(name, (u, r, ref), craft_direction(u, r, ref), rank_safe) for name, u, r, ref in rank_deficient]

    def _closed_form(G, rho, ref, rows=True, targets=True, reference=True, sign=1):
        U = G / G.norm(dim=1, keepdim=True) if rows else G
        rho = rho / rho.sum() if targets else rho
        g_hat = ref / ref.norm() if reference and ref.norm() > 0 else ref
        return g_hat + sign * torch.linalg.pinv(U) @ (rho - U @ g_hat)

    mistakes = [
        Mistake("rho as given (not divided by its sum)", lambda G, r, ref: _closed_form(G, r, ref, targets=False)),
        Mistake("the reference not scaled to unit length", lambda G, r, ref: _closed_form(G, r, ref, reference=False)),
        Mistake(
            "the raw pseudo-gradients G instead of unit rows U", lambda G, r, ref: _closed_form(G, r, ref, rows=False)
        ),
        Mistake(
            "the wrong sign of the correction, g_hat - U^+ (rho - U g_hat)",
            lambda G, r, ref: _closed_form(G, r, ref, sign=-1),
        ),
    ]
    return run_cases("check_craft_direction", your_function, cases, rtol=1e-6, atol=1e-9, mistakes=mistakes)


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
    """Check ``your_function`` against SCAFFOLD's control-variate update.

    It must be ``your_function(client_controls: Tensor[m, d], server_control: Tensor[d], deltas: Tensor[m, d],
    local_steps: Tensor[m], lr: float) -> Tensor[m, d]``: SCAFFOLD's option-II control variates
    ``c_i+ = c_i - c + (x - y_i) / (K_i lr)``, where ``deltas[i] = y_i - x``.

    Args:
        your_function: the reader's SCAFFOLD control-variate update, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import scaffold_control_update

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    inputs = [
        (
            "5 clients with different step counts",
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
    hints = {
        "5 clients with different step counts": "divide each client's (x - y_i) by its own K_i lr",
        "first round: all controls zero": "deltas[i] = y_i - x, so (x - y_i) = -deltas[i]: mind the sign",
        "one client": "c_i+ = c_i - c + (x - y_i) / (K_i lr)",
        "a client that did not move": "a client with y_i = x keeps c_i - c",
    }
    cases = [
        Case(name, (ci, c, d, k, lr), scaffold_control_update(ci, c, d, k, lr), hints[name])
        for name, ci, c, d, k, lr in inputs
    ]
    mistakes = [
        Mistake(
            "the wrong sign, (y_i - x) for (x - y_i)",
            lambda ci, c, d, k, lr: ci - c + d / (k[:, None].to(d.dtype) * lr),
        ),
        Mistake(
            "leaving out the server control c",
            lambda ci, c, d, k, lr: ci - d / (k[:, None].to(d.dtype) * lr),
        ),
        Mistake("leaving out the step counts K_i (dividing by lr only)", lambda ci, c, d, k, lr: ci - c - d / lr),
    ]
    return run_cases("check_scaffold_control_update", your_function, cases, rtol=1e-6, atol=1e-9, mistakes=mistakes)


def check_fednova(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function`` against FedNova's direction.

    It must be ``your_function(deltas: Tensor[m, d], local_steps: Tensor[m], weights: Tensor[m]) -> Tensor[d]``:
    FedNova's direction for plain local SGD, ``tau_eff * sum_i p_i deltas_i / tau_i`` with
    ``p = weights / weights.sum()`` and ``tau_eff = sum_i p_i tau_i``.

    Args:
        your_function: the reader's FedNova direction, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import fednova_aggregate

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    inputs = [
        (
            "5 clients with different step counts",
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
    hints = {
        "5 clients with different step counts": "divide each update by its step count tau_i, then scale by tau_eff",
        "equal step counts: FedAvg": "with equal tau_i, FedNova is FedAvg's weighted mean",
        "one client": "with one client, its own update",
        "a client with weight zero": "p = weights / weights.sum(); a weight of zero drops the client, and its tau_i",
        "sample counts as weights, many steps": "normalise the weights: p = weights / weights.sum()",
    }
    cases = [Case(name, (d, k, w), fednova_aggregate(d, k, w), hints[name]) for name, d, k, w in inputs]
    mistakes = [
        Mistake("plain FedAvg (no normalisation by the step counts)", lambda d, k, w: (w / w.sum()) @ d),
        Mistake(
            "sum_i p_i deltas_i / tau_i without the factor tau_eff",
            lambda d, k, w: ((w / w.sum()) / k.to(d.dtype)) @ d,
        ),
        Mistake(
            "tau_eff as the plain mean of the step counts (not weighted by p)",
            lambda d, k, w: k.to(d.dtype).mean() * (((w / w.sum()) / k.to(d.dtype)) @ d),
        ),
    ]
    return run_cases("check_fednova", your_function, cases, rtol=1e-6, atol=1e-9, mistakes=mistakes)


def _fair_plan(
    plan,
    disjoint: bool = True,
    min_eval: int = 3,
    distinct_eval: bool = True,
    every_method: bool = True,
    distinct_steps: bool = True,
    need_tuning: bool = True,
) -> bool:
    """The benchmark protocol's test of a plan (see :mod:`fedlearn_edu.benchmark`).

    The keyword arguments leave out, or get wrong, one rule at a time: the usual mistakes.
    """
    tune, ev = set(plan["tuning_seeds"]), set(plan["eval_seeds"])
    n_eval = len(ev) if distinct_eval else len(plan["eval_seeds"])
    steps = plan["server_lr"]
    tuned = [len(set(v)) if distinct_steps else len(v) for v in steps.values()]
    return bool(
        (tune or not need_tuning)
        and n_eval >= min_eval
        and not (disjoint and tune & ev)
        and len(steps) > 0
        and (all if every_method else any)(n >= 2 for n in tuned)
    )


def check_fair_comparison(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(plan) -> bool``: is a comparison plan fair?

    ``plan`` is ``{"tuning_seeds": [...], "eval_seeds": [...], "server_lr": {method: [candidates]}}``.
    Fair (the protocol of :mod:`fedlearn_edu.benchmark`): at least one tuning seed, at least 3
    different evaluation seeds (a seed listed twice is one seed), no seed in both, and every
    method (the baseline included) tries at least 2 different server steps.

    Args:
        your_function: ``(plan: dict) -> bool``, the reader's check.
        seed: unused (the cases are fixed); kept for the same call as the other checks.

    Returns:
        ``True`` when every case passes (a report of the cases is printed).
    """
    good = {"fedavg": [0.5, 1.0, 2.0], "new": [0.3, 1.0, 3.0]}
    inputs = [
        (
            "a fair plan: disjoint seeds, 3 evaluation seeds, every step tuned",
            {"tuning_seeds": [0], "eval_seeds": [1, 2, 3], "server_lr": good},
            "this plan meets every rule: a tuning seed, 3 different evaluation seeds (>= 3, not > 3), "
            "none in both, >= 2 different steps for every method",
        ),
        (
            "evaluation seeds reuse a tuning seed",
            {"tuning_seeds": [0, 1], "eval_seeds": [1, 2, 3], "server_lr": good},
            "a seed used to pick the step cannot judge it: tuning and evaluation seeds must be disjoint",
        ),
        (
            "only two evaluation seeds",
            {"tuning_seeds": [0], "eval_seeds": [1, 2], "server_lr": good},
            "a fair comparison asks for >= 3 evaluation seeds",
        ),
        (
            "an evaluation seed listed twice is one seed",
            {"tuning_seeds": [0], "eval_seeds": [1, 1, 2], "server_lr": good},
            "[1, 1, 2] is two evaluation seeds, not three: count *different* seeds",
        ),
        (
            "the new method's step is tuned, the baseline's is not",
            {"tuning_seeds": [0], "eval_seeds": [1, 2, 3], "server_lr": {"fedavg": [1.0], "new": [0.3, 1.0, 3.0]}},
            "every method, the baseline too, tries >= 2 steps",
        ),
        (
            "a step listed twice is one candidate",
            {"tuning_seeds": [0], "eval_seeds": [4, 5, 6], "server_lr": {"fedavg": [1.0, 1.0], "new": [1.0, 2.0]}},
            "count *different* candidate steps",
        ),
        (
            "no tuning seed at all",
            {"tuning_seeds": [], "eval_seeds": [1, 2, 3], "server_lr": good},
            "the steps must be picked on some seed",
        ),
        (
            "five evaluation seeds, two tuning seeds",
            {"tuning_seeds": [10, 11], "eval_seeds": [0, 1, 2, 3, 4], "server_lr": good},
            "more seeds than the minimum, still disjoint: fair",
        ),
    ]
    cases = [Case(name, (plan,), _fair_plan(plan), hint) for name, plan, hint in inputs]
    mistakes = [  # each leaves out, or gets wrong, one rule of the plan
        Mistake(
            "skipping the test that tuning and evaluation seeds are disjoint", lambda p: _fair_plan(p, disjoint=False)
        ),
        Mistake(
            "accepting 2 evaluation seeds (a fair comparison asks for >= 3)",
            lambda p: _fair_plan(p, min_eval=2),
        ),
        Mistake(
            "counting the evaluation seeds with len() (a seed listed twice is one seed: len(set(...)))",
            lambda p: _fair_plan(p, distinct_eval=False),
        ),
        Mistake(
            "not testing every method's steps (every method, the baseline too, tries >= 2 different steps)",
            lambda p: _fair_plan(p, every_method=False),
        ),
        Mistake(
            "counting the candidate steps with len() (a step listed twice is one candidate: len(set(...)))",
            lambda p: _fair_plan(p, distinct_steps=False),
        ),
        Mistake(
            "accepting a plan without a tuning seed (the steps must be picked on some seed)",
            lambda p: _fair_plan(p, need_tuning=False),
        ),
    ]
    return run_cases("check_fair_comparison", your_function, cases, mistakes=mistakes, answers=(True, False))


def _verdict(diff: float, half_width: float) -> str:
    return "inconclusive" if abs(diff) <= half_width else ("better" if diff > 0 else "worse")


def check_interval_reading(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(diff, half_width) -> str``: the verdict on a paired difference.

    The difference ``diff +- half_width`` is a method minus FedAvg, higher is better, and the
    one comparison made (no family to correct for): ``"better"`` when the whole interval lies
    above 0, ``"worse"`` when it lies below, ``"inconclusive"`` when it contains 0 (an interval
    that touches 0 contains it). Not ``"tie"``: an interval containing 0 is absence of evidence,
    not evidence of equality (that takes an equivalence test, :func:`fedlearn_edu.stats.tost`).

    Args:
        your_function: ``(diff: float, half_width: float) -> str``, the reader's verdict.
        seed: unused (the cases are fixed); kept for the same call as the other checks.

    Returns:
        ``True`` when every case passes (a report of the cases is printed).
    """
    inputs = [
        (
            "interval above zero",
            (0.03, 0.01),
            "diff is the method minus FedAvg and higher is better: [0.02, 0.04] lies above 0, 'better'",
        ),
        ("interval below zero", (-0.05, 0.02), "[-0.07, -0.03] lies below 0 (diff + half_width < 0): 'worse'"),
        (
            "positive mean, interval containing zero",
            (0.04, 0.1),
            "a positive mean is not enough: [-0.06, 0.14] contains 0",
        ),
        (
            "negative mean, interval containing zero",
            (-0.01, 0.03),
            "a negative mean is not enough: [-0.04, 0.02] contains 0",
        ),
        (
            "mean beyond half the half-width, interval containing zero",
            (0.04, 0.06),
            "the interval is diff +- half_width, [-0.02, 0.1]: it contains 0",
        ),
        ("interval touching zero", (0.02, 0.02), "[0, 0.04] contains 0: inconclusive"),
        ("zero difference, zero width", (0.0, 0.0), "a zero-width interval at 0 contains 0: inconclusive"),
        (
            "interval just above zero",
            (0.15, 0.1),
            "[0.05, 0.25] lies above 0: half_width is already the interval's half-width",
        ),
        ("large difference, wide interval", (0.2, 0.1), "[0.1, 0.3] lies above 0: 'better'"),
    ]
    cases = [Case(name, args, _verdict(*args), hint) for name, args, hint in inputs]
    mistakes = [
        Mistake(
            "the sign of the mean difference alone (an interval containing 0 is 'inconclusive')",
            lambda d, h: "better" if d > 0 else ("worse" if d < 0 else "inconclusive"),
        ),
        Mistake(
            "'better' and 'worse' swapped (diff is the method minus FedAvg, and higher is better)",
            lambda d, h: {"better": "worse", "worse": "better"}.get(_verdict(d, h), "inconclusive"),
        ),
        Mistake(
            "'worse' for every interval not above 0 ('worse' needs it wholly below 0: diff + half_width < 0)",
            lambda d, h: "better" if d - h > 0 else "worse",
        ),
        Mistake(
            "'inconclusive' for an interval below 0 (diff + half_width < 0 is 'worse')",
            lambda d, h: "better" if d - h > 0 else "inconclusive",
        ),
        Mistake("half the half-width (a 2 x too narrow interval)", lambda d, h: _verdict(d, h / 2)),
        Mistake(
            "the half-width widened again, by 1.96 or 2 (half_width is already the interval's half-width)",
            lambda d, h: _verdict(d, 1.96 * h),
        ),
        Mistake(
            "the old word 'tie' for an interval containing 0",
            lambda d, h: _verdict(d, h).replace("inconclusive", "tie"),
        ),
        Mistake(
            "an interval that touches 0 read as not containing it (abs(diff) <= half_width is inconclusive)",
            lambda d, h: "inconclusive" if abs(d) < h else ("better" if d > 0 else "worse"),
        ),
    ]
    return run_cases(
        "check_interval_reading", your_function, cases, mistakes=mistakes, answers=("better", "worse", "inconclusive")
    )


# --------------------------------------------------------------------------
# several methods against one baseline: Holm's and Benjamini-Hochberg's adjusted p-values


def _running_max(a):
    return np.maximum.accumulate(a)


def _min_from_top(a):
    return np.minimum.accumulate(a[::-1])[::-1]


def _as_is(a):
    return a


def _holm_factor(m, k):
    return m - k + 1


def _bh_factor(m, k):
    return m / k


def _by_rank(pvalues, factor: Callable, monotone: Callable, cap: bool = True, order: str = "input") -> torch.Tensor:
    """Adjusted p-values by rank: ``monotone(p_(k) factor(m, k))`` for ``k = 1..m``, capped at 1.

    ``p_(1) <= ... <= p_(m)`` are the sorted p-values. ``order`` says how the result comes back:
    in the input's order (``"input"``, the right answer), or as the usual mistakes return it:
    still sorted (``"sorted"``), with the sort undone the wrong way round (``"inverted"``:
    ``adjusted[rank]``), or with no sort at all, the input taken as sorted (``"unsorted"``).
    """
    p = np.array(pvalues, dtype=np.float64).reshape(-1)
    m = p.size
    rank = np.arange(m) if order == "unsorted" else np.argsort(p, kind="stable")
    adjusted = monotone(p[rank] * factor(m, np.arange(1, m + 1)))
    if cap:
        adjusted = np.minimum(adjusted, 1.0)
    if order == "sorted":
        out = adjusted
    elif order == "inverted":
        out = adjusted[rank]
    else:
        out = np.empty(m)
        out[rank] = adjusted
    return torch.as_tensor(out, dtype=torch.float64)


def _holm_numpy(pvalues) -> torch.Tensor:
    """Holm's adjusted p-values in NumPy: :func:`check_holm`'s reference where statsmodels is not installed."""
    return _by_rank(pvalues, _holm_factor, _running_max)


def _bh_numpy(pvalues) -> torch.Tensor:
    """Benjamini-Hochberg's q-values in NumPy: :func:`check_bh`'s reference where SciPy is older than 1.11."""
    return _by_rank(pvalues, _bh_factor, _min_from_top)


@contextlib.contextmanager
def _cheap_collections() -> Iterator[None]:
    """Make ``gc.collect()`` cheap inside the block: the objects alive at its start are frozen.

    statsmodels' Holm adjustment calls ``gc.collect()`` on every call; with PyTorch loaded that
    is a tenth of a second or more, seconds for a checker's cases. Objects someone else froze
    are left as they are (nothing is frozen then).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _holm_reference() -> Callable:
    """Holm's adjusted p-values by statsmodels when it is installed, else by :func:`_holm_numpy`."""
    try:
        from statsmodels.stats.multitest import multipletests
    except ImportError:  # statsmodels is not a dependency of the package
        return _holm_numpy
    return lambda p: torch.as_tensor(multipletests(np.array(p, dtype=np.float64), method="holm")[1])


def _bh_reference() -> Callable:
    """Benjamini-Hochberg's q-values by SciPy (1.11 or later), else by :func:`_bh_numpy`."""
    try:
        from scipy.stats import false_discovery_control
    except ImportError:  # a SciPy older than the 1.11 the package asks for, installed by hand
        return _bh_numpy
    return lambda p: torch.as_tensor(false_discovery_control(np.array(p, dtype=np.float64), method="bh"))


def _pvalue_inputs(seed: int, fixed: list, hint: str) -> list:
    """The fixed cases, then p-values drawn from ``seed``: m = 1, 2, 5, 16, 64, raw and with ties.

    A draw mixes uniform p-values (true null hypotheses) with small ones (real differences,
    down to 1e-5); the second draw of each size is rounded to two decimals, so that it has
    ties, and for the larger sizes p-values of 0 and 1.
    """
    rng = np.random.default_rng(seed)
    inputs = list(fixed)
    for m in (1, 2, 5, 16, 64):
        p = rng.uniform(size=m)
        small = rng.random(m) < 0.3
        p[small] *= 10.0 ** -rng.integers(1, 6, size=int(small.sum())).astype(np.float64)
        inputs.append((f"{m} p-value{'s' if m > 1 else ''}: small ones among uniform nulls", p, hint))
        if m > 1:
            inputs.append((f"{m} p-values rounded to two decimals (ties)", np.round(rng.uniform(size=m), 2), hint))
    return inputs


def check_holm(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(pvalues) -> adjusted``: Holm's step-down adjusted p-values.

    ``pvalues`` holds m p-values in any order, one per hypothesis (say, each method against
    FedAvg), as a NumPy array or a plain list. Holm (1979): sort them,
    ``p_(1) <= ... <= p_(m)``; multiply ``p_(k)`` by ``m - k + 1``; take the running maximum
    along the sorted order (step-down: an adjusted p-value is never below that of a smaller
    p-value); cap at 1; and return the m adjusted p-values **in the input's order**, without
    changing the caller's list or array. Rejecting where the adjusted p-value is ``<= alpha``
    controls the family-wise error rate at alpha. The reference is
    ``statsmodels.stats.multitest.multipletests(p, method="holm")[1]``, or a NumPy version of
    the same steps where statsmodels is not installed.

    The cases: fixed ones, each testing one step (the factor, the running maximum, the cap, the
    order, ties, p-values of 0 and 1, a list input), then p-values drawn from ``seed`` for
    m = 1, 2, 5, 16 and 64, with ties. A failure names the usual mistake it matches: no
    running maximum, the factor ``m - k`` or ``m`` (Bonferroni) instead of ``m - k + 1``, no
    cap, the output in sorted order, the input sorted in place.

    Example::

        >>> import numpy as np
        >>> def holm(pvalues):
        ...     p = np.array(pvalues, dtype=float)  # a copy: the caller's p-values stay as they are
        ...     m, order = p.size, np.argsort(p)
        ...     adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
        ...     out = np.empty(m)
        ...     out[order] = adjusted  # back to the input's order
        ...     return out
        >>> check_holm(holm)
        check_holm: all 17 cases passed.
        True

    Args:
        your_function: the reader's Holm adjustment, with the signature above.
        seed: seeds the drawn p-values.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    reference = _holm_reference()
    step = "sort, multiply p_(k) by m - k + 1, running maximum, cap at 1, back to the input's order"
    fixed = [
        ("a single p-value (m = 1) is its own adjusted p-value", np.array([0.03]), "for m = 1, m - k + 1 = 1"),
        (
            "two sorted p-values: factors 2 and 1",
            np.array([0.01, 0.04]),
            "multiply p_(k), the k-th smallest, by m - k + 1: m for the smallest, 1 for the largest",
        ),
        (
            "sorted p-values whose products decrease: the running maximum",
            np.array([0.01, 0.011, 0.03, 0.04]),
            "step-down: an adjusted p-value is never below that of a smaller p-value; "
            "take the running maximum along the sorted order",
        ),
        (
            "products above 1 are capped at 1",
            np.array([0.4, 0.6, 0.7]),
            "an adjusted p-value is a probability: min(1, ...)",
        ),
        (
            "unsorted input: the output follows the input's order",
            np.array([0.03, 0.001, 0.02, 0.5, 0.012]),
            "return the adjusted values in the input's order: out[order] = adjusted, with order = np.argsort(p)",
        ),
        (
            "tied p-values get equal adjusted p-values",
            np.array([0.02, 0.01, 0.02, 0.02, 0.5]),
            "the running maximum makes tied p-values equal, whichever order the sort leaves them in",
        ),
        ("p-values of exactly 0 and 1", np.array([1.0, 0.0, 0.5, 0.0, 1.0]), "0 stays 0, and the cap at 1 holds"),
        (
            "a plain Python list, not an array",
            [0.2, 0.01, 0.04, 0.03, 0.2, 0.6],
            "accept any sequence: start from a copy, p = np.array(pvalues, dtype=float)",
        ),
    ]
    with _cheap_collections():
        cases = [Case(name, (p,), reference(p), hint) for name, p, hint in _pvalue_inputs(seed, fixed, step)]
    mistakes = [
        Mistake(
            "no running maximum (step-down monotonicity: the adjusted p-values must not decrease "
            "along the sorted p-values)",
            lambda p: _by_rank(p, _holm_factor, _as_is),
        ),
        Mistake(
            "the factor m - k instead of m - k + 1 (the largest p-value multiplied by 0)",
            lambda p: _by_rank(p, lambda m, k: m - k, _running_max),
        ),
        Mistake(
            "the factor m for every p-value (Bonferroni) instead of Holm's m - k + 1",
            lambda p: _by_rank(p, lambda m, k: np.full(k.shape, float(m)), _running_max),
        ),
        Mistake(
            "no cap at 1 (an adjusted p-value is at most 1)", lambda p: _by_rank(p, _holm_factor, _running_max, False)
        ),
        Mistake(
            "the adjusted p-values in sorted order instead of the input's order",
            lambda p: _by_rank(p, _holm_factor, _running_max, order="sorted"),
        ),
        Mistake(
            "the sort undone the wrong way round (adjusted[order] instead of out[order] = adjusted)",
            lambda p: _by_rank(p, _holm_factor, _running_max, order="inverted"),
        ),
        Mistake(
            "no sort: the input taken as sorted", lambda p: _by_rank(p, _holm_factor, _running_max, order="unsorted")
        ),
        Mistake(
            "a running minimum from the top (Benjamini-Hochberg's step-up) instead of Holm's running maximum",
            lambda p: _by_rank(p, _holm_factor, _min_from_top),
        ),
    ]
    return run_cases(
        "check_holm", your_function, cases, rtol=1e-6, atol=1e-12, mistakes=mistakes, inputs_unchanged=True
    )


def check_bh(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(pvalues) -> qvalues``: Benjamini-Hochberg's adjusted p-values (q-values).

    ``pvalues`` holds m p-values in any order, as a NumPy array or a plain list.
    Benjamini and Hochberg (1995), as adjusted p-values: sort them, ``p_(1) <= ... <= p_(m)``;
    multiply ``p_(k)`` by ``m / k``; take the running minimum **from the top** (step-up:
    ``q_(k) = min over j >= k of p_(j) m / j``); cap at 1; and return the m q-values in the
    input's order, without changing the caller's list or array. Rejecting where the q-value is
    ``<= alpha`` controls the false discovery rate at alpha (for independent tests). The
    reference is ``scipy.stats.false_discovery_control(p, method="bh")`` (SciPy 1.11 or later),
    or a NumPy version of the same steps with an older SciPy.

    The cases are those of :func:`check_holm`, with values where BH's steps show. A failure
    names the usual mistake it matches: no running minimum, a running minimum from the bottom
    or a running maximum instead, the factor ``k / m`` for ``m / k``, the output in sorted
    order, the input sorted in place. The cap at 1 binds only when the running minimum is
    missing or wrong (from the top, ``q_(m) = p_(m) <= 1`` bounds every q-value), so a missing
    cap is caught together with one of those.

    Example::

        >>> import numpy as np
        >>> def bh(pvalues):
        ...     p = np.array(pvalues, dtype=float)
        ...     m, order = p.size, np.argsort(p)
        ...     q = p[order] * m / np.arange(1, m + 1)
        ...     q = np.minimum(1.0, np.minimum.accumulate(q[::-1])[::-1])  # running minimum from the top
        ...     out = np.empty(m)
        ...     out[order] = q
        ...     return out
        >>> check_bh(bh)
        check_bh: all 17 cases passed.
        True

    Args:
        your_function: the reader's Benjamini-Hochberg adjustment, with the signature above.
        seed: seeds the drawn p-values.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    reference = _bh_reference()
    step = "sort, multiply p_(k) by m / k, running minimum from the top, cap at 1, back to the input's order"
    from_top = (
        "step-up: q_(k) = min over j >= k of p_(j) m / j, a running minimum from the largest p-value down, "
        "e.g. np.minimum.accumulate(q[::-1])[::-1]; then min(1, ...)"
    )
    fixed = [
        ("a single p-value (m = 1) is its own q-value", np.array([0.03]), "for m = 1, m / k = 1"),
        (
            "two sorted p-values: factors 2 and 1",
            np.array([0.01, 0.04]),
            "multiply p_(k), the k-th smallest, by m / k: m for the smallest, 1 for the largest",
        ),
        ("large p-values whose products exceed 1: step-up and cap", np.array([0.5, 0.52, 0.9]), from_top),
        (
            "sorted p-values whose products rise and fall: the running minimum from the top",
            np.array([0.01, 0.03, 0.032, 0.05]),
            from_top,
        ),
        (
            "unsorted input: the output follows the input's order",
            np.array([0.03, 0.001, 0.02, 0.5, 0.012]),
            "return the q-values in the input's order: out[order] = q, with order = np.argsort(p)",
        ),
        (
            "tied p-values get equal q-values",
            np.array([0.02, 0.01, 0.02, 0.02, 0.5]),
            "the running minimum from the top makes tied p-values equal, whichever order the sort leaves them in",
        ),
        ("p-values of exactly 0 and 1", np.array([1.0, 0.0, 0.5, 0.0, 1.0]), "0 stays 0, and the cap at 1 holds"),
        (
            "a plain Python list, not an array",
            [0.2, 0.01, 0.04, 0.03, 0.2, 0.6],
            "accept any sequence: start from a copy, p = np.array(pvalues, dtype=float)",
        ),
    ]
    cases = [Case(name, (p,), reference(p), hint) for name, p, hint in _pvalue_inputs(seed, fixed, step)]
    mistakes = [
        Mistake(
            "no running minimum from the top (step-up: q_(k) = min over j >= k of p_(j) m / j)",
            lambda p: _by_rank(p, _bh_factor, _as_is),
        ),
        Mistake(
            "neither the running minimum from the top nor the cap at 1",
            lambda p: _by_rank(p, _bh_factor, _as_is, False),
        ),
        Mistake("the factor k / m instead of m / k", lambda p: _by_rank(p, lambda m, k: k / m, _min_from_top)),
        Mistake(
            "a running minimum from the bottom (np.minimum.accumulate without reversing) instead of from the top",
            lambda p: _by_rank(p, _bh_factor, np.minimum.accumulate),
        ),
        Mistake(
            "a running maximum (Holm's step-down) instead of a running minimum from the top",
            lambda p: _by_rank(p, _bh_factor, _running_max),
        ),
        Mistake(
            "the q-values in sorted order instead of the input's order",
            lambda p: _by_rank(p, _bh_factor, _min_from_top, order="sorted"),
        ),
        Mistake(
            "the sort undone the wrong way round (q[order] instead of out[order] = q)",
            lambda p: _by_rank(p, _bh_factor, _min_from_top, order="inverted"),
        ),
        Mistake(
            "no sort: the input taken as sorted", lambda p: _by_rank(p, _bh_factor, _min_from_top, order="unsorted")
        ),
    ]
    return run_cases("check_bh", your_function, cases, rtol=1e-6, atol=1e-12, mistakes=mistakes, inputs_unchanged=True)


def check_trimmed_mean(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(deltas: Tensor[m, d], beta: float) -> Tensor[d]``: the trimmed mean.

    Per coordinate, sort the m values, drop the ``b = floor(beta m)`` smallest and the b
    largest, and average the ``m - 2b`` left (Yin et al., 2018; ``beta = 0`` is the mean);
    :func:`fedlearn_edu.aggregators.trimmed_mean` is the reference.

    Args:
        your_function: the reader's trimmed mean, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import trimmed_mean

    g = torch.Generator().manual_seed(seed)
    per_coordinate = "trim each coordinate separately: sort along the client axis (dim 0), not whole rows"
    outlier = torch.randn(9, 4, generator=g)
    outlier[3] = 1e6
    outlier[7, 1] = -1e6
    mixed = torch.randn(10, 3, generator=g)
    mixed[0, 0], mixed[1, 1], mixed[2, 2] = 50.0, -50.0, 50.0  # a different client is extreme per coordinate
    inputs = [
        ("10 clients, beta = 0.1 (one value cut at each end)", torch.randn(10, 6, generator=g), 0.1, per_coordinate),
        ("beta = 0 is the plain mean", torch.randn(5, 3, generator=g), 0.0, "b = floor(0 m) = 0: nothing is cut"),
        ("7 clients, beta = 0.2: b = floor(1.4) = 1", torch.randn(7, 4, generator=g), 0.2, "b = floor(beta m)"),
        ("9 clients, beta = 0.3: b = floor(2.7) = 2", torch.randn(9, 4, generator=g), 0.3, "b = floor(beta m)"),
        ("an attacker's huge values are cut", outlier, 0.2, per_coordinate),
        ("a different client is extreme in each coordinate", mixed, 0.1, per_coordinate),
        (
            "10 clients, beta = 0.45: b = 4, the mean of the two middle values",
            torch.randn(10, 5, generator=g),
            0.45,
            "cut b values at *each* end, keep m - 2b",
        ),
        (
            "ties: repeated values",
            torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 9.0], [3.0, 2.0]]),
            0.25,
            "cut by position in the sorted values, not by value: a repeated value may stay",
        ),
        ("float64, 12 clients, beta = 0.25", torch.randn(12, 7, generator=g, dtype=torch.float64), 0.25, ""),
    ]
    cases = [Case(name, (x, beta), trimmed_mean(x, beta), hint) for name, x, beta, hint in inputs]

    def cut(x, b_low, b_high):
        return x.sort(0).values[b_low : x.shape[0] - b_high].mean(0)

    def rows_by_norm(x, beta):
        b = int(beta * x.shape[0])
        keep = x.norm(dim=1).argsort()[b : x.shape[0] - b]
        return x[keep].mean(0)

    mistakes = [
        Mistake("the plain mean (nothing cut)", lambda x, beta: x.mean(0)),
        Mistake(
            "b = round(beta m) instead of floor(beta m)",
            lambda x, beta: cut(x, round(beta * x.shape[0]), round(beta * x.shape[0])),
        ),
        Mistake("cutting the b largest values only", lambda x, beta: cut(x, 0, int(beta * x.shape[0]))),
        Mistake("dropping whole updates by their norm instead of values per coordinate", rows_by_norm),
    ]
    return run_cases("check_trimmed_mean", your_function, cases, mistakes=mistakes)


def check_krum(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(deltas: Tensor[m, d], f: int) -> Tensor[d]``: Krum's pick.

    Krum (Blanchard et al., 2017) scores each client i by the sum of the squared distances
    ``||Delta_i - Delta_j||^2`` to its ``m - f - 2`` nearest *other* clients and returns the
    update of the client with the lowest score (a tie: the lower index);
    :func:`fedlearn_edu.aggregators.krum` is the reference.

    Args:
        your_function: the reader's Krum, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import krum

    g = torch.Generator().manual_seed(seed)
    cluster = torch.randn(9, 5, generator=g) * 0.1
    cluster[6:] += 20.0  # three attackers together, far from the six honest clients
    spread = torch.randn(7, 3, generator=g)
    spread[2] = spread[[0, 1, 3, 4, 5, 6]].mean(0)  # one client at the centre of the others
    twins = torch.randn(6, 2, generator=g)
    twins[4] = twins[1]  # two identical clients: the lower index wins a tie
    score = "score = the sum of the m - f - 2 smallest squared distances to the *other* clients"
    inputs = [
        ("7 clients, f = 2", torch.randn(7, 4, generator=g), 2, score),
        (
            "five clients on a line, f = 1: m - f - 2 = 2 neighbours pick another client than 3",
            torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [4.0, 0.0], [8.0, 0.0]]),
            1,
            "m - f - 2 = 2 neighbours: the client at 1 scores 1 + 1 = 2, the one at 2 scores 1 + 4 = 5 "
            "(with 3 neighbours the client at 2 would win, 9 against 11)",
        ),
        ("one far outlier, f = 1", torch.cat([torch.randn(5, 3, generator=g), torch.full((1, 3), 1e3)]), 1, score),
        (
            "three colluding attackers far from six honest clients, f = 3",
            cluster,
            3,
            "m - f - 2 = 4 neighbours: each honest client has 5 close ones, each attacker only 2",
        ),
        ("a client at the centre of the others, f = 2", spread, 2, score),
        ("f = 0: the m - 2 nearest", torch.randn(5, 6, generator=g), 0, "with f = 0 each client counts m - 2"),
        (
            "six clients on a line, f = 1: squared distances pick another client than distances",
            torch.tensor([[1.0, 0.0], [10.0, 0.0], [9.0, 0.0], [8.0, 0.0], [5.0, 0.0], [2.0, 0.0]]),
            1,
            "square the distances: ||Delta_i - Delta_j||^2",
        ),
        ("two identical clients (a tie)", twins, 1, "a tie in the scores goes to the lower index"),
        ("float64, 11 clients, f = 4", torch.randn(11, 8, generator=g, dtype=torch.float64), 4, score),
    ]
    cases = [Case(name, (x, f), krum(x, f), hint) for name, x, f, hint in inputs]

    def scored(x, k, squared=True, self_too=False):
        d = torch.cdist(x.double(), x.double())
        d = d**2 if squared else d
        if not self_too:
            d = d + torch.diag(torch.full((x.shape[0],), float("inf"), dtype=d.dtype))
        return x[torch.sort(d, dim=1).values[:, :k].sum(1).argmin()]

    mistakes = [
        Mistake("distances, not squared distances", lambda x, f: scored(x, x.shape[0] - f - 2, squared=False)),
        Mistake(
            "m - f - 1 neighbours instead of m - f - 2 (Krum sums over the m - f - 2 nearest others)",
            lambda x, f: scored(x, x.shape[0] - f - 1),
        ),
        Mistake(
            "counting the client itself (distance 0) among its neighbours",
            lambda x, f: scored(x, x.shape[0] - f - 2, self_too=True),
        ),
        Mistake("the mean of the updates", lambda x, f: x.mean(0)),
    ]
    return run_cases("check_krum", your_function, cases, mistakes=mistakes)


def check_clip_and_noise(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(deltas, clip, noise_multiplier, xi, denominator) -> Tensor[d]``: DP-FedAvg's noisy mean.

    ``(sum_i Delta_i min(1, C / ||Delta_i||) + z C xi) / D`` with ``deltas: Tensor[m, d]``,
    ``clip`` C, ``noise_multiplier`` z, ``xi: Tensor[d]`` a standard normal draw (given, so that
    the answer is exact) and the fixed ``denominator`` D (McMahan et al., 2018). The clipping
    is of each client's whole update, and a zero update stays zero. The reference is
    :func:`fedlearn_edu.aggregators.norm_clip` and the formula of
    :class:`fedlearn_edu.strategies.DPFedAvg`.

    Args:
        your_function: the reader's clip-and-noise, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .aggregators import norm_clip

    def reference(x, clip, z, xi, denominator):
        clipped, _ = norm_clip(x, clip)
        return (clipped.sum(0) + z * clip * xi) / denominator

    g = torch.Generator().manual_seed(seed)
    whole = "clip the norm of each client's whole update, Delta_i min(1, C / ||Delta_i||), not each coordinate"
    zero = torch.randn(4, 5, generator=g)
    zero[2] = 0.0
    huge = torch.cat([torch.randn(3, 4, generator=g) * 0.1, torch.full((1, 4), 1e4)])
    inputs = [
        ("6 clients, all longer than C = 0.5", torch.randn(6, 8, generator=g) * 3, 0.5, 1.0, 6, whole),
        (
            "every update shorter than C: nothing clipped",
            torch.randn(5, 4, generator=g) * 0.01,
            10.0,
            0.7,
            5,
            "min(1, C / ||Delta_i||) is 1 for a short update: it is not scaled up",
        ),
        ("z = 0: clipping only", torch.randn(5, 3, generator=g), 0.3, 0.0, 5, whole),
        (
            "a fixed denominator D = 10 with 4 clients this round",
            torch.randn(4, 6, generator=g),
            1.0,
            1.1,
            10,
            "divide by the fixed D, not by the round's number of clients",
        ),
        ("a zero update stays zero", zero, 0.5, 0.5, 4, "min(1, C / 0) is 1: a zero update is not rescaled"),
        ("one huge update: its influence is at most C", huge, 1.0, 2.0, 4, whole),
        ("float64, 9 clients", torch.randn(9, 7, generator=g, dtype=torch.float64), 0.8, 0.3, 9, ""),
    ]
    cases = []
    for name, x, clip, z, denominator, hint in inputs:
        xi = torch.randn(x.shape[1], generator=g, dtype=torch.float64).to(x.dtype)
        cases.append(Case(name, (x, clip, z, xi, denominator), reference(x, clip, z, xi, denominator), hint))
    mistakes = [
        Mistake(
            "clipping each coordinate to [-C, C] instead of the update's norm",
            lambda x, c, z, xi, d: (x.clamp(-c, c).sum(0) + z * c * xi) / d,
        ),
        Mistake(
            "dividing by the round's number of clients m instead of the fixed D",
            lambda x, c, z, xi, d: reference(x, c, z, xi, x.shape[0]),
        ),
        Mistake(
            "noise of standard deviation z instead of z C",
            lambda x, c, z, xi, d: (norm_clip(x, c)[0].sum(0) + z * xi) / d,
        ),
        Mistake("no clipping", lambda x, c, z, xi, d: (x.sum(0) + z * c * xi) / d),
        Mistake(
            "scaling every update to norm C (the short ones too)",
            lambda x, c, z, xi, d: ((c * x / x.norm(dim=1, keepdim=True).clamp_min(1e-30)).sum(0) + z * c * xi) / d,
        ),
    ]
    return run_cases("check_clip_and_noise", your_function, cases, mistakes=mistakes)


# --------------------------------------------------------------------------
# Convergence under heterogeneity (chapter 3, *Why FedAvg drifts, in theorems*).
# Appended as its own section: registered in __all__ and CHECKERS here, after the chapter
# 2 checkers, so that the module's checker machinery above stays untouched.


def check_gradient_dissimilarity(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(grads: Tensor[N, d], weights: Tensor[N]) -> float``: the gradient dissimilarity.

    ``zeta^2 = sum_i p_i ||g_i - g||^2`` with ``p = weights / weights.sum()`` and ``g = sum_i p_i g_i``,
    the mean the federation's gradient is (:func:`fedlearn_edu.convergence.gradient_dissimilarity`).

    Args:
        your_function: the reader's dissimilarity, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .convergence import gradient_dissimilarity

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    weighted = "weight by the data shares p_i = n_i / n, both in the mean g and in the average of the squares"
    same_mean = torch.randn(1, 4, generator=g, dtype=dt)
    inputs = [
        (
            "6 clients of unequal sizes",
            torch.randn(6, 5, generator=g, dtype=dt) + 1,
            torch.tensor([5.0, 80, 20, 3, 40, 12]),
            weighted,
        ),
        (
            "clients that agree: zero dissimilarity, whatever the gradient's size",
            same_mean.repeat(4, 1) * 10,
            torch.tensor([1.0, 2.0, 3.0, 4.0]),
            "zeta^2 measures the spread around the federation's gradient g, not the gradients' size: subtract g",
        ),
        (
            "sample counts as weights (summing to 300, not 1)",
            torch.randn(3, 2, generator=g, dtype=dt) * 3,
            torch.tensor([100.0, 150.0, 50.0]),
            "normalise the weights: p = weights / weights.sum()",
        ),
        (
            "a client with weight zero does not count",
            torch.randn(4, 3, generator=g, dtype=dt),
            torch.tensor([2.0, 0.0, 1.0, 1.0]),
            weighted,
        ),
        (
            "one client: nothing to disagree with",
            torch.randn(1, 6, generator=g, dtype=dt),
            torch.tensor([7.0]),
            "one client has g_1 = g",
        ),
    ]
    cases = [Case(name, (x, w.to(dt)), float(gradient_dissimilarity(x, w.to(dt))), hint) for name, x, w, hint in inputs]

    def p_of(w):
        return w / w.sum()

    mistakes = [
        Mistake(
            "the mean squared gradient sum_i p_i ||g_i||^2, without subtracting the federation's gradient g",
            lambda x, w: float(p_of(w) @ (x**2).sum(1)),
        ),
        Mistake(
            "the plain mean over clients (the data shares ignored)",
            lambda x, w: float(((x - x.mean(0)) ** 2).sum(1).mean()),
        ),
        Mistake(
            "centring on the plain mean of the gradients instead of the weighted g",
            lambda x, w: float(p_of(w) @ ((x - x.mean(0)) ** 2).sum(1)),
        ),
        Mistake(
            "the mean distance sum_i p_i ||g_i - g|| (not squared)",
            lambda x, w: float(p_of(w) @ (x - p_of(w) @ x).norm(dim=1)),
        ),
        Mistake(
            "unnormalised weights sum_i n_i ||g_i - g||^2",
            lambda x, w: float(w @ ((x - p_of(w) @ x) ** 2).sum(1)),
        ),
    ]
    return run_cases("check_gradient_dissimilarity", your_function, cases, rtol=1e-6, atol=1e-9, mistakes=mistakes)


def check_participation_estimate(your_function: Callable, seed: int = 0) -> bool:
    """Check ``your_function(deltas, sizes, num_clients, total) -> Tensor[d]``: the unbiased participation estimate.

    ``deltas: Tensor[m, d]`` are the updates of the ``m`` clients sampled uniformly without
    replacement from ``N = num_clients``, ``sizes: Tensor[m]`` their sample counts ``n_i`` and
    ``total`` the federation's ``n = sum`` over all N clients. The estimate of the full average
    ``sum_i (n_i / n) Delta_i`` that is unbiased over the sampling is
    ``(N / m) sum_{i in S} (n_i / n) Delta_i`` (:func:`fedlearn_edu.convergence.unbiased_estimate`).

    Args:
        your_function: the reader's estimate, with the signature above.
        seed: seeds the random inputs of the cases.

    Returns:
        ``True`` when every case passes; otherwise ``False``, after printing the first
        failing case with its expected and received values and a hint.
    """
    from .convergence import unbiased_estimate

    g = torch.Generator().manual_seed(seed)
    dt = torch.float64
    scale = "multiply by N / m: each client is sampled with probability m / N"
    inputs = [
        (
            "3 of 10 clients of unequal sizes",
            torch.randn(3, 4, generator=g, dtype=dt),
            torch.tensor([50.0, 10, 200]),
            10,
            1000.0,
            scale,
        ),
        (
            "identical updates: the estimate still scales with the sampled data share",
            torch.ones(2, 3, dtype=dt),
            torch.tensor([30.0, 10.0]),
            8,
            400.0,
            "do not renormalise over the sampled clients: divide n_i by the whole federation's n",
        ),
        (
            "every client sampled (m = N): the full average",
            torch.randn(4, 2, generator=g, dtype=dt),
            torch.tensor([10.0, 20.0, 30.0, 40.0]),
            4,
            100.0,
            "with m = N the estimate is sum_i (n_i / n) Delta_i",
        ),
        ("one of 20 clients", torch.randn(1, 5, generator=g, dtype=dt), torch.tensor([12.0]), 20, 600.0, scale),
        (
            "5 of 50 clients, float64",
            torch.randn(5, 7, generator=g, dtype=dt),
            torch.rand(5, generator=g, dtype=dt) * 90 + 10,
            50,
            2500.0,
            scale,
        ),
    ]
    cases = [
        Case(name, (d, n.to(dt), N, total), unbiased_estimate(d, n.to(dt) / total, N), hint)
        for name, d, n, N, total, hint in inputs
    ]
    mistakes = [
        Mistake(
            "renormalising over the sampled clients, sum_S n_i Delta_i / sum_S n_i (biased)",
            lambda d, n, N, total: (n @ d) / n.sum(),
        ),
        Mistake("leaving out the factor N / m", lambda d, n, N, total: (n / total) @ d),
        Mistake("the plain mean of the sampled updates", lambda d, n, N, total: d.mean(0)),
        Mistake("dividing by m instead of multiplying by N / m", lambda d, n, N, total: (n / total) @ d / d.shape[0]),
    ]
    return run_cases("check_participation_estimate", your_function, cases, rtol=1e-6, atol=1e-9, mistakes=mistakes)


__all__ += ["check_gradient_dissimilarity", "check_participation_estimate"]
CHECKERS = {
    **{k: v for k, v in CHECKERS.items() if "(chapter 1)" in v or "(chapter 2)" in v},
    "check_gradient_dissimilarity": (
        "the gradient dissimilarity zeta^2 = sum_i p_i ||g_i - g||^2 of a federation (chapter 3)"
    ),
    "check_participation_estimate": (
        "the unbiased partial-participation estimate (N/m) sum_S (n_i/n) Delta_i (chapter 3)"
    ),
    **{k: v for k, v in CHECKERS.items() if not ("(chapter 1)" in v or "(chapter 2)" in v)},
}

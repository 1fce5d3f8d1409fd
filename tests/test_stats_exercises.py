"""The multiple-comparison checkers: Holm's and Benjamini-Hochberg's adjusted p-values.

A right answer passes; each usual wrong one fails with a message that names its mistake; the
checkers' expected values are statsmodels' and SciPy's, and their NumPy fallbacks (used where
those are missing) agree with them.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.stats
import torch

import fedlearn_edu.exercises as ex
from fedlearn_edu.exercises import check_bh, check_holm

multitest = pytest.importorskip("statsmodels.stats.multitest")
if not hasattr(scipy.stats, "false_discovery_control"):  # SciPy >= 1.11
    pytest.skip("scipy.stats.false_discovery_control needs SciPy 1.11", allow_module_level=True)


@pytest.fixture(autouse=True)
def cheap_collections():
    """statsmodels' Holm calls gc.collect() on every call: the objects alive before a test are frozen."""
    with ex._cheap_collections():
        yield


def _adjust(pvalues, factor, monotone, cap=True, order="input"):
    """Sort, multiply p_(k) by factor(m, k), make monotone, cap, put back: right and wrong variants."""
    p = np.array(pvalues, dtype=float)
    m = p.size
    rank = np.argsort(p, kind="stable")
    adjusted = monotone(p[rank] * factor(m, np.arange(1, m + 1)))
    if cap:
        adjusted = np.minimum(adjusted, 1.0)
    if order == "sorted":
        return adjusted
    out = np.empty(m)
    out[rank] = adjusted
    return out


def running_max(a):
    return np.maximum.accumulate(a)


def min_from_top(a):
    return np.minimum.accumulate(a[::-1])[::-1]


def as_is(a):
    return a


def holm_factor(m, k):
    return m - k + 1


def bh_factor(m, k):
    return m / k


def holm(pvalues):
    return _adjust(pvalues, holm_factor, running_max)


def bh(pvalues):
    return _adjust(pvalues, bh_factor, min_from_top)


def holm_statsmodels(pvalues):
    return multitest.multipletests(np.asarray(pvalues, dtype=float), method="holm")[1]


def bh_scipy(pvalues):
    return scipy.stats.false_discovery_control(np.asarray(pvalues, dtype=float), method="bh")


def draws(n, seed=2026):
    """n sets of p-values: m from 1 to 64, uniform nulls with small ones mixed in, some rounded (ties, 0, 1)."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        m = int(rng.choice([1, 2, 3, 5, 8, 16, 33, 64]))
        p = rng.uniform(size=m)
        small = rng.random(m) < 0.3
        p[small] *= 10.0 ** -rng.integers(1, 8, size=int(small.sum())).astype(float)
        yield np.round(p, 2) if i % 3 == 0 else p


def _cases_of(checker):
    """The cases a checker builds, without running them."""
    seen = []
    original = ex.run_cases
    ex.run_cases = lambda title, fn, cases, **kw: seen.extend(cases) or True
    try:
        checker(None)
    finally:
        ex.run_cases = original
    return seen


# --------------------------------------------------------------------------
# right answers pass


@pytest.mark.parametrize("checker, right", [(check_holm, holm), (check_bh, bh)])
def test_a_right_answer_passes(capsys, checker, right):
    assert checker(right) is True
    assert "all 17 cases passed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("checker, library", [(check_holm, holm_statsmodels), (check_bh, bh_scipy)])
def test_the_libraries_pass_on_100_seeds(capsys, checker, library):
    """statsmodels' Holm and SciPy's BH pass the checkers on 100 seeds of drawn p-values."""
    assert all(checker(library, seed=seed) for seed in range(100))
    assert capsys.readouterr().out.count("all 17 cases passed") == 100


def test_lists_and_tensors_are_accepted_as_output(capsys):
    assert check_holm(lambda p: [float(v) for v in holm(p)]) is True
    assert check_bh(lambda p: torch.tensor(bh(p), dtype=torch.float32)) is True
    assert capsys.readouterr().out.count("cases passed") == 2


def test_the_cases_cover_the_sizes_ties_zeros_ones_and_unsorted_input():
    for checker in (check_holm, check_bh):
        cases = _cases_of(checker)
        sizes = {len(c.args[0]) for c in cases}
        assert {1, 2, 5, 16, 64} <= sizes
        values = [np.asarray(c.args[0], dtype=float) for c in cases]
        assert any(len(np.unique(v)) < len(v) for v in values)  # ties
        assert any((v == 0).any() for v in values) and any((v == 1).any() for v in values)
        assert any((np.diff(v) < 0).any() for v in values)  # unsorted input
        assert any(isinstance(c.args[0], list) for c in cases)  # a plain list


# --------------------------------------------------------------------------
# each usual mistake fails, and the message names it


def _bonferroni(pvalues):
    return np.minimum(1.0, np.asarray(pvalues, dtype=float) * len(pvalues))


HOLM_MISTAKES = [
    ("no running maximum", lambda p: _adjust(p, holm_factor, as_is), "no running maximum (step-down monotonicity"),
    ("m - k", lambda p: _adjust(p, lambda m, k: m - k, running_max), "the factor m - k instead of m - k + 1"),
    ("Bonferroni", _bonferroni, "the factor m for every p-value (Bonferroni)"),
    ("no cap", lambda p: _adjust(p, holm_factor, running_max, cap=False), "no cap at 1"),
    (
        "sorted order",
        lambda p: _adjust(p, holm_factor, running_max, order="sorted"),
        "the adjusted p-values in sorted order instead of the input's order",
    ),
    (
        "BH's running minimum",
        lambda p: _adjust(p, holm_factor, min_from_top),
        "a running minimum from the top (Benjamini-Hochberg's step-up) instead of Holm's running maximum",
    ),
]

BH_MISTAKES = [
    ("no running minimum", lambda p: _adjust(p, bh_factor, as_is), "no running minimum from the top"),
    (
        "k / m",
        lambda p: _adjust(p, lambda m, k: k / m, min_from_top),
        "the factor k / m instead of m / k",
    ),
    (
        "no running minimum, no cap",
        lambda p: _adjust(p, bh_factor, as_is, cap=False),
        "neither the running minimum from the top nor the cap at 1",
    ),
    (
        "a running minimum from the bottom",
        lambda p: _adjust(p, bh_factor, np.minimum.accumulate),
        "a running minimum from the bottom (np.minimum.accumulate without reversing)",
    ),
    (
        "sorted order",
        lambda p: _adjust(p, bh_factor, min_from_top, order="sorted"),
        "the q-values in sorted order instead of the input's order",
    ),
]


@pytest.mark.parametrize(
    "checker, wrong, named",
    [(check_holm, w, n) for _, w, n in HOLM_MISTAKES] + [(check_bh, w, n) for _, w, n in BH_MISTAKES],
    ids=[f"holm: {i}" for i, _, _ in HOLM_MISTAKES] + [f"bh: {i}" for i, _, _ in BH_MISTAKES],
)
def test_a_usual_mistake_fails_with_its_name(capsys, checker, wrong, named):
    assert checker(wrong) is False
    out = capsys.readouterr().out
    assert "failed" in out and "expected:" in out and "received:" in out, out
    hints = [line for line in out.splitlines() if line.strip().startswith("hint:")]
    assert len(hints) == 1 and named in hints[0], out  # this mistake, and no other, is named


@pytest.mark.parametrize("checker, adjust", [(check_holm, holm), (check_bh, bh)])
@pytest.mark.parametrize(
    "kind, change, first",
    [
        (np.ndarray, lambda p, out: p.sort(), "unsorted input: the output follows the input's order"),
        (list, lambda p, out: p.sort(), "a plain Python list, not an array"),
        (np.ndarray, lambda p, out: p.__setitem__(slice(None), out), "two sorted p-values: factors 2 and 1"),
    ],
    ids=["array sorted", "list sorted", "array overwritten"],
)
def test_changing_the_callers_pvalues_in_place_fails(capsys, checker, adjust, kind, change, first):
    """Right values, but the caller's array or list sorted (or overwritten) in place: the message says so."""

    def in_place(pvalues):
        out = adjust(pvalues)
        if isinstance(pvalues, kind):
            change(pvalues, out)
        return out

    assert checker(in_place) is False
    out = capsys.readouterr().out
    assert f"case '{first}' failed: your function changed its input in place" in out, out
    assert "after call:" in out and "work on a copy" in out


def test_a_missing_cap_is_harmless_for_bh_with_a_right_running_minimum(capsys):
    """From the top, q_(m) = p_(m) <= 1 bounds every q-value: without the cap BH is still right."""
    assert check_bh(lambda p: _adjust(p, bh_factor, min_from_top, cap=False)) is True
    assert "all 17 cases passed" in capsys.readouterr().out


def test_a_solution_that_raises_or_returns_the_wrong_length_fails(capsys):
    def unfinished(pvalues):
        raise NotImplementedError("sort first")

    assert check_holm(unfinished) is False
    assert "raised NotImplementedError: sort first" in capsys.readouterr().out
    assert check_bh(lambda p: bh(p)[:-1]) is False
    assert "shape" in capsys.readouterr().out


# --------------------------------------------------------------------------
# the references: statsmodels and SciPy, or the NumPy fallbacks


def test_the_checkers_expected_values_are_the_libraries():
    for checker, library in ((check_holm, holm_statsmodels), (check_bh, bh_scipy)):
        for case in _cases_of(checker):
            np.testing.assert_allclose(case.expected.numpy(), library(case.args[0]), rtol=1e-12, atol=0)


@pytest.mark.parametrize("checker, library", [(check_holm, holm_statsmodels), (check_bh, bh_scipy)])
def test_the_checkers_references_agree_with_the_libraries_on_100_draws(checker, library):
    reference = (ex._holm_reference if checker is check_holm else ex._bh_reference)()
    for p in draws(100):
        np.testing.assert_allclose(reference(p).numpy(), library(p), rtol=1e-12, atol=0)


@pytest.mark.parametrize("fallback, library", [(ex._holm_numpy, holm_statsmodels), (ex._bh_numpy, bh_scipy)])
def test_the_numpy_fallbacks_agree_with_the_libraries_on_100_draws(fallback, library):
    for p in draws(100):
        got = fallback(p)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), library(p), rtol=1e-12, atol=1e-300)
        np.testing.assert_array_equal(fallback(list(p)).numpy(), got.numpy())  # a list gives the same


def test_without_statsmodels_check_holm_uses_the_numpy_fallback(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "statsmodels.stats.multitest", None)  # `import` raises ImportError
    assert ex._holm_reference() is ex._holm_numpy
    for case in _cases_of(check_holm):
        np.testing.assert_allclose(case.expected.numpy(), holm_statsmodels(case.args[0]), rtol=1e-12, atol=0)
    assert check_holm(holm) is True
    assert check_holm(_bonferroni) is False
    assert "Bonferroni" in capsys.readouterr().out


def test_without_false_discovery_control_check_bh_uses_the_numpy_fallback(monkeypatch, capsys):
    monkeypatch.delattr(scipy.stats, "false_discovery_control")  # as in SciPy < 1.11
    assert ex._bh_reference() is ex._bh_numpy
    monkeypatch.undo()
    expected = {c.name: bh_scipy(c.args[0]) for c in _cases_of(check_bh)}
    monkeypatch.delattr(scipy.stats, "false_discovery_control")
    for case in _cases_of(check_bh):
        np.testing.assert_allclose(case.expected.numpy(), expected[case.name], rtol=1e-12, atol=0)
    assert check_bh(bh) is True
    assert check_bh(lambda p: _adjust(p, bh_factor, as_is)) is False
    assert "no running minimum from the top" in capsys.readouterr().out

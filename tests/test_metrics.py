"""The metrics (:mod:`fedlearn_edu.metrics`): fairness over clients against direct computation, and the
summaries over seeds (mean and sample standard deviation, the book's mean ± 95 % half-width)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu.metrics import fairness_metrics, format_over_seeds, over_seeds


def test_over_seeds_is_the_mean_and_the_sample_std():
    v = np.random.default_rng(0).random(5)
    mean, std = over_seeds(v)
    assert mean == pytest.approx(np.mean(v))
    assert std == pytest.approx(np.std(v, ddof=1))
    assert std != pytest.approx(np.std(v))  # ddof = 1, not the population std


def test_over_seeds_needs_two_seeds():
    with pytest.raises(ValueError, match="at least two seeds"):
        over_seeds([0.5])


class _Run:
    def __init__(self, acc):
        self.acc = acc

    def metrics(self):
        return fairness_metrics(self.acc)


def test_format_over_seeds_reports_each_method():
    runs = {"A": [_Run([0.2, 0.4]), _Run([0.4, 0.6])], "B": [_Run([1.0, 1.0]), _Run([1.0, 1.0])]}
    text = format_over_seeds(runs, metrics=("mean",))
    row_a = next(line for line in text.splitlines() if line.startswith("A "))
    half = 12.706204736174707 * 0.1414213562373095 / np.sqrt(2)  # t_{0.975, 1} sd / sqrt(2)
    assert f"0.400 ± {half:.3f}" in row_a  # means 0.3 and 0.5: the 95 % half-width, not the std (0.141)
    assert "1.000 ± 0.000" in text and "2 seeds" in text and "95 % half-width" in text
    with pytest.raises(ValueError, match="Unknown metric"):
        format_over_seeds(runs, metrics=("median",))
    with pytest.raises(ValueError, match=r"at least two seeds.*\['B'\]"):
        format_over_seeds({"A": runs["A"], "B": runs["B"][:1]})


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, st.integers(1, 60), elements=st.floats(0, 1)))
def test_fairness_metrics_against_direct_computation(acc):
    out = fairness_metrics(acc)
    k = max(1, int(0.1 * acc.size))
    s = sorted(acc)
    assert math.isclose(out["mean"], float(np.mean(acc)), abs_tol=1e-12)
    assert math.isclose(out["std"], float(np.std(acc)), abs_tol=1e-12)
    assert math.isclose(out["worst10"], sum(s[:k]) / k, abs_tol=1e-12)
    assert math.isclose(out["best10"], sum(s[-k:]) / k, abs_tol=1e-12)
    assert out["worst10"] <= out["mean"] + 1e-12 <= out["best10"] + 2e-12


def test_fairness_metrics_ignores_nan_and_rejects_empty():
    assert fairness_metrics([0.5, float("nan"), 1.0])["mean"] == 0.75
    with pytest.raises(ValueError):
        fairness_metrics([float("nan")])


def test_fairness_metrics_refuses_inf_and_negative_accuracies():
    for bad in ([0.5, math.inf], [0.5, -0.1], [0.5, 1.5]):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            fairness_metrics(bad)
    assert fairness_metrics([0.5, math.nan])["mean"] == 0.5  # NaN: a client without test data

"""fedlearn_edu.stats against independent computations: scipy and statsmodels as oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from fedlearn_edu import stats


def _draws(seed, m):
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=m) ** rng.uniform(0.3, 3.0)  # some small, some large
    if m > 3:
        p[: m // 4] = rng.uniform(0, 1e-3, size=m // 4)  # a few strong effects
        p[-1] = p[-2]  # a tie
    return rng.permutation(p)


@pytest.mark.parametrize("m", [1, 2, 5, 16, 64])
def test_holm_and_bh_equal_statsmodels(m):
    for seed in range(4):  # statsmodels' multipletests takes a good part of a second a call
        p = _draws(seed, m)
        before = p.copy()
        np.testing.assert_allclose(stats.holm(p), multipletests(p, method="holm")[1], rtol=1e-12, atol=0)
        np.testing.assert_allclose(stats.benjamini_hochberg(p), multipletests(p, method="fdr_bh")[1], rtol=1e-12)
        np.testing.assert_allclose(stats.benjamini_hochberg(p), sps.false_discovery_control(p), rtol=1e-12)
        np.testing.assert_array_equal(p, before)  # the caller's array is not modified


def test_holm_properties():
    p = np.array([0.01, 0.04, 0.03, 0.5, 0.0, 1.0])
    h = stats.holm(p)
    assert (h >= p).all() and (h <= 1).all()
    order = np.argsort(p)
    assert (np.diff(h[order]) >= 0).all()  # step-down monotone
    assert stats.holm([]).size == 0 and stats.benjamini_hochberg([]).size == 0
    with pytest.raises(ValueError, match="p-values"):
        stats.holm([0.1, 1.5])
    with pytest.raises(ValueError, match="p-values"):
        stats.benjamini_hochberg([math.nan])


@pytest.mark.parametrize("seed", range(10))
def test_paired_test_equals_scipy_ttest_rel(seed):
    rng = np.random.default_rng(seed)
    base = rng.normal(0.8, 0.05, size=12)
    other = base + rng.normal(0.01, 0.02, size=12)
    r = stats.paired_test(other - base)
    ref = sps.ttest_rel(other, base)
    assert r.p == pytest.approx(ref.pvalue, rel=1e-10)
    lo, hi = ref.confidence_interval(0.95)
    assert r.mean - r.half_width == pytest.approx(lo, rel=1e-10)
    assert r.mean + r.half_width == pytest.approx(hi, rel=1e-10)
    assert r.d_z == pytest.approx(np.mean(other - base) / np.std(other - base, ddof=1))
    assert r.n == 12


def test_paired_test_degenerate_and_bad_input():
    assert stats.paired_test([0.0, 0.0, 0.0]).p == 1.0
    same = stats.paired_test([0.5, 0.5, 0.5])
    assert same.p == 0.0 and same.d_z == math.inf
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired_test([0.1])
    with pytest.raises(ValueError, match="finite"):
        stats.paired_test([0.1, math.nan])


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("margin", [0.005, 0.02, 0.1])
def test_tost_equals_statsmodels(seed, margin):
    rng = np.random.default_rng(seed)
    base = rng.normal(0.8, 0.05, size=10)
    other = base + rng.normal(rng.uniform(-0.03, 0.03), 0.02, size=10)
    p_sm = ttost_paired(other, base, -margin, margin)[0]
    assert stats.tost(other - base, margin) == pytest.approx(p_sm, rel=1e-10)


def test_tost_refuses_a_bad_margin():
    for margin in (0, -0.1, math.inf, math.nan, True, "0.02"):
        with pytest.raises(ValueError, match="margin"):
            stats.tost([0.0, 0.01], margin)


@pytest.mark.parametrize("n", [2, 6, 9, 12])
@pytest.mark.parametrize("seed", range(5))
def test_sign_flip_equals_scipy_permutation_test(n, seed):
    d = np.random.default_rng(seed).normal(0.01, 0.03, size=n)
    ref = sps.permutation_test(
        (d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples", n_resamples=np.inf, vectorized=True
    ).pvalue
    assert stats.sign_flip_p(d) == pytest.approx(ref, abs=1e-12)


def test_sign_flip_exact_values():
    assert stats.sign_flip_p([1.0] * 6) == 2 / 2**6  # all the same sign: the two extreme patterns
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="24"):
        stats.sign_flip_p(np.ones(25))


@pytest.mark.parametrize("n, tests", [(3, 1), (10, 1), (10, 16), (20, 23)])
def test_min_detectable_difference_equals_statsmodels_power(n, tests):
    sd = 0.03
    mdd = stats.min_detectable_difference(sd, n, 0.05, 0.8, tests)
    effect = TTestPower().solve_power(nobs=n, alpha=0.05 / tests, power=0.8, alternative="two-sided")
    assert mdd == pytest.approx(effect * sd, rel=1e-4)
    # and it is what it claims: the power at that difference is 80 %
    power = TTestPower().power(effect_size=mdd / sd, nobs=n, alpha=0.05 / tests)
    assert power == pytest.approx(0.8, abs=1e-4)


def test_power_table_shrinks_with_seeds_and_grows_with_tests():
    t = stats.power_table(1.0, seeds=(3, 10, 20), tests=16)
    assert (np.diff(t.uncorrected) < 0).all() and (np.diff(t.corrected) < 0).all()
    assert (t.corrected > t.uncorrected).all()
    with pytest.raises(ValueError, match="sd"):
        stats.min_detectable_difference(0.0, 10)
    with pytest.raises(ValueError, match="n must"):
        stats.min_detectable_difference(1.0, 1)


def test_verdict_words():
    assert stats.verdict(0.03, 0.01) == "better"
    assert stats.verdict(-0.03, 0.01) == "worse"
    assert stats.verdict(0.001, 0.5, 0.01) == "equivalent"
    assert stats.verdict(0.03, 0.2, 0.3) == "inconclusive"
    assert stats.verdict(0.03, 0.2) == "inconclusive"  # no equivalence test: never "equivalent"
    assert set(stats.VERDICTS) == {"better", "worse", "equivalent", "inconclusive"}

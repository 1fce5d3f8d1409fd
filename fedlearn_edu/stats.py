"""Statistics of comparisons over seeds: intervals, paired tests, corrections, verdicts, power.

The book's one statistical language (chapter *Comparing the methods*, ``book/notation.md``):

- a number over seeds is reported as **mean ± the half-width of its 95 % Student-t interval**;
- two methods are compared on the **same seeds** (a seed fixes the federation, the initial
  model, the sampling): the per-seed differences ``d_s`` are a paired sample, and
  :func:`paired_test` gives their mean, interval, two-sided t-test p-value and standardised
  effect ``d_z = mean(d) / sd(d)``;
- a table that makes many comparisons corrects them: :func:`holm` within a *family*
  (e.g. every method against FedAvg on one federation and one criterion) and
  :func:`benjamini_hochberg` across a whole guide;
- :func:`verdict`: **better / worse** only when the corrected p-value is below ``alpha``;
  **equivalent** only when an equivalence test (:func:`tost`, two one-sided tests with a
  declared margin) passes; otherwise **inconclusive** — absence of evidence, never a "tie";
- :func:`min_detectable_difference`: the smallest true paired difference a design detects with
  the given power, before and after a correction (print it before you run a grid).

Everything is :mod:`scipy.stats`; the Holm adjustment is the step-down of Holm (1979), cross-checked
against :mod:`statsmodels` in the tests.

>>> from fedlearn_edu import stats
>>> r = stats.paired_test([0.02, 0.03, 0.01, 0.04, 0.02])
>>> round(r.mean, 3), round(r.half_width, 3), round(r.p, 4)
(0.024, 0.014, 0.0093)
>>> stats.holm([0.01, 0.04, 0.03]).round(3).tolist()
[0.03, 0.06, 0.06]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "VERDICTS",
    "format_p",
    "PairedTest",
    "t_interval",
    "paired_test",
    "tost",
    "sign_flip_p",
    "holm",
    "benjamini_hochberg",
    "verdict",
    "min_detectable_difference",
    "power_table",
]

# The words of a comparison with a baseline; "baseline" is the baseline's own row, "untested" a row
# without enough paired seeds.
VERDICTS = ("better", "worse", "equivalent", "inconclusive")


def _sample(values, name: str = "values", minimum: int = 2) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size < minimum:
        raise ValueError(f"{name} needs at least {minimum} values, got {v.size}.")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} must be finite, got {v.tolist()!r}.")
    return v


def _level(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
    return float(confidence)


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval of the mean (n - 1 dof).

    Args:
        values: ``array[S]`` one measurement per seed, ``S >= 2``.
        confidence: the interval's level.

    Returns:
        ``(mean, half_width)``; the interval is ``mean +- half_width``.

    Example:
        >>> m, h = t_interval([0.5, 0.7, 0.6])
        >>> round(m, 3), round(h, 3)
        (0.6, 0.248)
    """
    from scipy import stats

    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size < 2:
        raise ValueError(f"t_interval needs at least 2 values, got {v.size}.")
    half = stats.t.ppf(0.5 + _level(confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(half)


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison over seeds (:func:`paired_test`).

    Attributes:
        n: the number of paired seeds.
        mean: the mean per-seed difference.
        half_width: the half-width of its Student-t interval (``mean +- half_width``).
        sd: the standard deviation of the differences (``ddof=1``).
        p: the two-sided one-sample t-test p-value of ``mean == 0``.
        d_z: the standardised effect ``mean / sd`` (``+-inf`` when every difference is the same
            non-zero number, ``0`` when all are zero).
    """

    n: int
    mean: float
    half_width: float
    sd: float
    p: float
    d_z: float


def paired_test(differences, confidence: float = 0.95) -> PairedTest:
    """Mean, t-interval, two-sided p-value and effect size of paired differences.

    When every difference is the same number the t statistic is undefined: a difference of
    exactly zero on every seed gives ``p = 1`` (no evidence of a difference), the same non-zero
    difference on every seed gives ``p = 0`` (the runs are deterministic, so this is a sure
    difference, e.g. a method that is bitwise another plus a constant).

    Args:
        differences: ``array[S]`` method minus baseline on each shared seed, ``S >= 2``, finite.
        confidence: the level of the interval.

    Returns:
        A :class:`PairedTest`.

    Raises:
        ValueError: fewer than 2 differences, a non-finite one, or a bad ``confidence``.

    Example:
        >>> r = paired_test([1.0, 2.0, 3.0])
        >>> r.n, r.mean, round(r.p, 3), r.d_z
        (3, 2.0, 0.074, 2.0)
    """
    from scipy import stats

    d = _sample(differences, "differences")
    mean, half = t_interval(d, confidence)
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
        dz = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    else:
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
        dz = mean / sd
    return PairedTest(int(d.size), float(mean), float(half), sd, p, float(dz))


def tost(differences, margin: float) -> float:
    """Equivalence test of paired differences: two one-sided t-tests against ``+-margin``.

    The differences are *equivalent* to zero within the margin when both ``mean > -margin`` and
    ``mean < margin`` are shown; the p-value is the larger of the two one-sided p-values
    (Schuirmann 1987). A small p-value is evidence of equivalence; a large one is not evidence
    of a difference.

    Args:
        differences: ``array[S]``, ``S >= 2``, finite.
        margin: the equivalence margin, ``> 0``, in the units of the differences.

    Returns:
        The TOST p-value in ``[0, 1]``.

    Raises:
        ValueError: ``margin <= 0`` or not finite, or bad differences.

    Example:
        >>> round(tost([0.001, -0.002, 0.0, 0.001, -0.001], margin=0.02), 6)
        2e-06
    """
    from scipy import stats

    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (0 < margin < math.inf):
        raise ValueError(f"margin must be a positive finite number, got {margin!r}.")
    d = _sample(differences, "differences")
    if d.std(ddof=1) == 0.0:
        return 0.0 if abs(d[0]) < margin else 1.0
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


def sign_flip_p(differences) -> float:
    """Exact two-sided sign-flip permutation p-value of paired differences (mean as statistic).

    Under the null hypothesis that the two methods are exchangeable on every seed, each
    difference is as likely positive as negative; the p-value is the share of the ``2**S`` sign
    patterns whose sum is at least as far from 0 as the observed one (the observed pattern
    included). It makes no normality assumption: a check on the t-test, meaningful from
    ``S >= 6`` (the smallest two-sided p-value is ``2 / 2**S``). The ``2**S`` sums are enumerated
    by doubling (the same numbers as :func:`scipy.stats.permutation_test` with
    ``permutation_type="samples"``, checked in the tests, in milliseconds instead of seconds).

    Args:
        differences: ``array[S]``, ``2 <= S <= 24``, finite.

    Returns:
        The exact permutation p-value.

    Example:
        >>> sign_flip_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        0.03125
    """
    d = _sample(differences, "differences")
    if d.size > 24:
        raise ValueError(f"sign_flip_p enumerates 2**S sign patterns; S = {d.size} > 24 is too many.")
    sums = np.zeros(1)
    for x in np.abs(d):
        sums = np.concatenate([sums + x, sums - x])
    observed = abs(float(d.sum()))
    tolerance = 1e-12 * max(observed, float(np.abs(d).sum()))
    return float(np.count_nonzero(np.abs(sums) >= observed - tolerance) / sums.size)


def _pvalues(pvalues) -> np.ndarray:
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
    if p.size and (np.isnan(p).any() or (p < 0).any() or (p > 1).any()):
        raise ValueError(f"p-values must be in [0, 1], got {p.tolist()!r}.")
    return p


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control), in the input's order.

    Sorted ascending, ``p_(k)`` becomes ``max_{j <= k} min(1, (m - j + 1) p_(j))``; a hypothesis
    is rejected at family-wise level ``alpha`` when its adjusted p-value is below ``alpha``.

    Args:
        pvalues: ``array[m]`` of p-values in ``[0, 1]`` (``m >= 0``).

    Returns:
        ``array[m]``, the adjusted p-values (the input is not modified).

    Example:
        >>> holm([0.01, 0.04, 0.03]).round(3).tolist()
        [0.03, 0.06, 0.06]
    """
    p = _pvalues(pvalues)
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def benjamini_hochberg(pvalues) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (q-values, false discovery rate), in the input's order.

    :func:`scipy.stats.false_discovery_control` with ``method="bh"``; an empty input gives an
    empty array.

    Args:
        pvalues: ``array[m]`` of p-values in ``[0, 1]``.

    Returns:
        ``array[m]``, the q-values.

    Example:
        >>> benjamini_hochberg([0.01, 0.04, 0.03]).round(3).tolist()
        [0.03, 0.04, 0.04]
    """
    from scipy import stats

    p = _pvalues(pvalues)
    if p.size == 0:
        return p.copy()
    return np.asarray(stats.false_discovery_control(p, method="bh"), dtype=np.float64)


def verdict(mean: float, p_adjusted: float, p_equivalence: float = math.nan, alpha: float = 0.05) -> str:
    """The word for a comparison: ``"better"``, ``"worse"``, ``"equivalent"`` or ``"inconclusive"``.

    Args:
        mean: the mean paired difference (method minus baseline, higher is better).
        p_adjusted: the corrected p-value of "no difference" (Holm within the family).
        p_equivalence: the corrected TOST p-value (NaN: no equivalence test).
        alpha: the level.

    Returns:
        ``"better"``/``"worse"`` when ``p_adjusted < alpha`` (by the sign of ``mean``),
        else ``"equivalent"`` when ``p_equivalence < alpha``, else ``"inconclusive"``.

    Example:
        >>> verdict(0.03, 0.01), verdict(0.03, 0.2), verdict(0.001, 0.9, 0.01)
        ('better', 'inconclusive', 'equivalent')
    """
    if p_adjusted < alpha and mean != 0:
        return "better" if mean > 0 else "worse"
    if p_equivalence < alpha:
        return "equivalent"
    return "inconclusive"


def format_p(p: float, alpha: float = 0.05) -> str:
    """A p-value to two significant digits, three where two would round it up to ``alpha``.

    So a p-value just below the level never prints as the level itself (0.0496 is not "0.05").

    Args:
        p: the p-value (NaN prints as ``"n/a"``).
        alpha: the level whose line rounding must not cross.

    Returns:
        The text.

    >>> format_p(0.0496), format_p(0.0504), format_p(0.012345)
    ('0.0496', '0.05', '0.012')
    """
    if not math.isfinite(p):
        return "n/a"
    text = f"{p:.2g}"
    return f"{p:.3g}" if p < alpha <= float(text) else text


def _power(delta: float, sd: float, n: int, alpha: float) -> float:
    from scipy import stats

    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = delta / sd * math.sqrt(n)
    power = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    if not math.isfinite(power):  # scipy's nct loses the far tail: the power is 1 there
        return 1.0 if nc > crit else 0.0
    return power


def min_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8, tests: int = 1) -> float:
    """The smallest true paired difference a two-sided paired t-test detects with ``power``.

    Solves ``P(|T| > t_{1 - a/2, n-1}) = power`` for the difference, where ``T`` follows the
    non-central t distribution with ``n - 1`` degrees of freedom and non-centrality
    ``difference * sqrt(n) / sd``. With ``tests = m > 1`` the level is ``a = alpha / m``:
    Bonferroni, the first (hardest) step of Holm's procedure in a family of ``m``, so the answer
    is what the corrected test can promise for every comparison of the family.

    Args:
        sd: the standard deviation of the paired differences (``> 0``).
        n: the number of paired seeds (``>= 2``).
        alpha: the level before correction.
        power: the wanted power, in ``(0, 1)``.
        tests: the number of comparisons the level is shared by.

    Returns:
        The minimum detectable difference, in the units of ``sd``.

    Example:
        >>> round(min_detectable_difference(1.0, 10), 2)
        1.0
    """
    from scipy import optimize

    if not (isinstance(sd, (int, float)) and 0 < sd < math.inf):
        raise ValueError(f"sd must be a positive finite number, got {sd!r}.")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}.")
    if isinstance(tests, bool) or not isinstance(tests, (int, np.integer)) or tests < 1:
        raise ValueError(f"tests must be a positive integer, got {tests!r}.")
    for name, v in (("alpha", alpha), ("power", power)):
        if not 0 < v < 1:
            raise ValueError(f"{name} must be in (0, 1), got {v!r}.")
    level = alpha / tests
    high = sd
    while _power(high, sd, int(n), level) < power:
        high *= 2
    return float(optimize.brentq(lambda x: _power(x, sd, int(n), level) - power, 0.0, high, xtol=1e-10 * sd))


def power_table(sd: float, seeds: Sequence[int] = (3, 5, 10, 15, 20, 30), tests: int = 1, alpha=0.05, power=0.8):
    """Minimum detectable differences for several numbers of seeds, before and after correction.

    Args:
        sd: the standard deviation of the paired differences.
        seeds: the numbers of paired seeds to tabulate.
        tests: the family size the corrected column shares ``alpha`` with (Bonferroni bound).
        alpha: the level before correction.
        power: the wanted power.

    Returns:
        A DataFrame with columns ``seeds``, ``uncorrected``, ``corrected`` (in ``sd``'s units).

    Example:
        >>> power_table(1.0, seeds=(10,), tests=16).round(2).to_dict("records")
        [{'seeds': 10, 'uncorrected': 1.0, 'corrected': 1.59}]
    """
    import pandas as pd

    rows = [
        {
            "seeds": int(n),
            "uncorrected": min_detectable_difference(sd, int(n), alpha, power),
            "corrected": min_detectable_difference(sd, int(n), alpha, power, tests),
        }
        for n in seeds
    ]
    return pd.DataFrame(rows)

"""FedOUI: the Beta fit and its fallbacks, the weights, FedAlign, the strategies.

The OUI signal itself is tested in tests/signals/test_oui.py.
"""

import math

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedlearn_edu.aggregators import (
    beta_moments,
    empirical_rank_scores,
    fedalign_weights,
    fedoui_scores,
    fedoui_weights,
    fit_beta,
)

FAST = settings(max_examples=40, deadline=None)

# The authors' representative round (their report, Table 2): OUI, n_k, score, weight.
PAPER_OUI = [0.1265, 0.2573, 0.3101, 0.3179, 0.3716]
PAPER_N = [210, 226, 66, 40, 17]
PAPER_SCORE = [0.0743, 0.8950, 0.6821, 0.6264, 0.3165]
PAPER_WEIGHT = [0.0538, 0.6890, 0.1534, 0.0854, 0.0184]


# ====================================================================== Beta fit
@FAST
@given(arrays(np.float64, st.integers(3, 30), elements=st.floats(0.02, 0.98)))
def test_fit_beta_moments_match_the_sample_moments(x):
    """The fitted Beta's mean and variance (from SciPy) equal the sample's (ddof = 1)."""
    alpha, beta, method = fit_beta(x)
    v = x.var(ddof=1)
    if np.ptp(x) == 0 or v == 0 or x.mean() * (1 - x.mean()) / v - 1 <= 0:
        assert method != "moments"
        return
    assert method == "moments"
    dist = scipy.stats.beta(alpha, beta)
    assert dist.mean() == pytest.approx(np.mean(x), rel=1e-9)
    assert dist.var() == pytest.approx(np.sum((x - x.mean()) ** 2) / (len(x) - 1), rel=1e-7)


def test_beta_moments_closed_form():
    a, b = beta_moments(2.5 / 10, 2.5 * 7.5 / (10**2 * 11))
    assert (a, b) == pytest.approx((2.5, 7.5))
    assert all(math.isnan(v) for v in beta_moments(0.5, 0.0))
    assert all(math.isnan(v) for v in beta_moments(0.5, 0.3))  # v >= m(1-m): c <= 0


@pytest.mark.parametrize("a, b", [(2.0, 5.0), (6.1, 15.94), (0.7, 0.9)])
def test_fit_beta_recovers_known_parameters_from_large_samples(a, b):
    x = np.random.default_rng(0).beta(a, b, size=40_000)
    alpha, beta, method = fit_beta(torch.tensor(x))
    assert method == "moments"
    assert alpha == pytest.approx(a, rel=0.05) and beta == pytest.approx(b, rel=0.05)


def test_zero_variance_falls_back_to_empirical_and_equal_scores():
    # six equal values whose float64 variance rounds to 9e-34, not 0 (found by hypothesis)
    for o in ([0.3] * 5, [0.0, 0.0], [0.22968368] * 6):
        alpha, beta, method = fit_beta(o)
        assert method == "empirical" and math.isnan(alpha) and math.isnan(beta)
        assert fedoui_scores(torch.tensor(o, dtype=torch.float64)).tolist() == pytest.approx([1.0] * len(o))
    # constant only after clipping to [1e-3, 1 - 1e-3]: no fit, and the ranks of the raw values
    assert fit_beta([0.0, 0.0005, 0.0])[2] == "empirical"
    assert fedoui_scores([0.0, 0.0005, 0.0]).tolist() == pytest.approx([0.75, 0.5, 0.75])
    w = fedoui_weights(torch.tensor([0.3] * 3), torch.tensor([1, 2, 7]))
    assert w.tolist() == pytest.approx([0.1, 0.2, 0.7])  # all equally typical: FedAvg's weights


def test_single_client_takes_the_empirical_path_and_all_the_weight():
    assert fit_beta([0.4])[2] == "empirical"
    assert fedoui_weights(torch.tensor([0.4]), torch.tensor([5])).tolist() == [1.0]


def test_overdispersed_values_fall_back_to_maximum_likelihood():
    o = [0.0, 1.0, 0.0, 1.0, 0.2]  # v > m(1-m): no moments fit
    alpha, beta, method = fit_beta(o)
    assert method == "mle"
    ref = scipy.stats.beta.fit(np.clip(o, 1e-3, 1 - 1e-3), floc=0, fscale=1)
    assert (alpha, beta) == pytest.approx(ref[:2], rel=1e-6)
    cdf = scipy.stats.beta.cdf(np.clip(o, 1e-4, 1 - 1e-4), alpha, beta)
    assert fedoui_scores(o).tolist() == pytest.approx(list(2 * np.minimum(cdf, 1 - cdf)), rel=1e-5)


def test_failed_maximum_likelihood_falls_back_to_rank_scores(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("solver failed")

    monkeypatch.setattr(scipy.stats.beta, "fit", broken)
    o = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.2], dtype=torch.float64)
    assert fit_beta(o)[2] == "empirical"
    ranks = np.array([1.5, 4.5, 1.5, 4.5, 3.0]) / 6
    assert fedoui_scores(o).tolist() == pytest.approx(list(2 * np.minimum(ranks, 1 - ranks)))
    assert empirical_rank_scores(o).tolist() == pytest.approx(list(2 * np.minimum(ranks, 1 - ranks)))


# ====================================================================== scores and weights
def test_the_authors_worked_example():
    o = torch.tensor(PAPER_OUI, dtype=torch.float64)
    alpha, beta, method = fit_beta(o)
    assert method == "moments" and round(alpha, 2) == 6.10 and round(beta, 2) == 15.94
    assert float(o.mean()) == pytest.approx(0.2767, abs=1e-4)
    # the report prints OUI to 4 decimals; scores and weights agree to that rounding
    assert fedoui_scores(o).tolist() == pytest.approx(PAPER_SCORE, abs=5e-4)
    assert float(fedoui_scores(o)[1]) == pytest.approx(0.895, abs=5e-4)
    assert fedoui_weights(o, torch.tensor(PAPER_N)).tolist() == pytest.approx(PAPER_WEIGHT, abs=1e-4)


@FAST
@given(m=st.integers(1, 12), data=st.data())
def test_weights_positive_sum_to_one_and_follow_the_formula(m, data):
    o = data.draw(arrays(np.float64, (m,), elements=st.floats(0, 1)))
    n = data.draw(arrays(np.int64, (m,), elements=st.integers(1, 500)))
    s = fedoui_scores(torch.tensor(o))
    assert bool(((s >= 0) & (s <= 1)).all())
    w = fedoui_weights(torch.tensor(o), torch.tensor(n), eps=1e-3)
    assert bool((w > 0).all()) and float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    expected = n * (1e-3 + s.numpy())
    np.testing.assert_allclose(w.numpy(), expected / expected.sum(), rtol=1e-10)
    fedavg_w = fedoui_weights(torch.tensor(o), torch.tensor(n), score_power=0.0)
    np.testing.assert_allclose(fedavg_w.numpy(), n / n.sum(), rtol=1e-12)


def test_central_client_scores_highest_and_tails_lowest():
    o = torch.tensor([0.10, 0.30, 0.32, 0.34, 0.36, 0.60], dtype=torch.float64)
    s = fedoui_scores(o)
    assert int(s.argmax()) in (2, 3) and set(s.argsort()[:2].tolist()) == {0, 5}


def test_weights_and_fit_reject_bad_input():
    with pytest.raises(ValueError, match=r"client 1\) = 1.2.*outside \[0, 1\]"):
        fedoui_weights(torch.tensor([0.2, 1.2]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="outside"):
        fit_beta([-0.1, 0.5])
    with pytest.raises(ValueError, match=r"client 2.*finite"):
        fedoui_scores(torch.tensor([0.2, 0.3, float("nan")]))
    with pytest.raises(ValueError, match="1-D"):
        fit_beta(torch.rand(2, 3))
    with pytest.raises(ValueError, match="m = 0"):
        fit_beta([])
    with pytest.raises(ValueError, match="m = 3"):
        fedoui_weights(torch.tensor([0.2, 0.3, 0.4]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="n_k > 0"):
        fedoui_weights(torch.tensor([0.2, 0.3]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="eps"):
        fedoui_weights(torch.tensor([0.2, 0.3]), torch.tensor([1, 2]), eps=0.0)


# ====================================================================== FedAlign
@FAST
@given(m=st.integers(1, 6), d=st.integers(1, 7), data=st.data())
def test_fedalign_weights_equal_numpy(m, d, data):
    # zeros, or magnitudes far from underflow (a subnormal norm product is 0 in one library, not the other)
    entries = st.one_of(st.just(0.0), st.floats(1e-3, 10), st.floats(-10, -1e-3))
    deltas = data.draw(arrays(np.float64, (m, d), elements=entries))
    n = data.draw(arrays(np.int64, (m,), elements=st.integers(1, 100)))
    mean = (n / n.sum()) @ deltas
    cos = np.array(
        [
            row @ mean / (np.linalg.norm(row) * np.linalg.norm(mean))
            if np.linalg.norm(row) * np.linalg.norm(mean) > 0
            else 0.0
            for row in deltas
        ]
    )
    expected = n * (np.maximum(np.clip(cos, -1, 1), 0) + 1e-3)
    got = fedalign_weights(torch.tensor(deltas), torch.tensor(n))
    np.testing.assert_allclose(got.numpy(), expected / expected.sum(), rtol=1e-8, atol=1e-14)


def test_fedalign_dict_equals_flat_and_downweights_opposite_client():
    g = torch.Generator().manual_seed(0)
    deltas = {"a.weight": torch.randn(3, 2, 2, generator=g), "a.bias": torch.randn(3, 2, generator=g)}
    flat = torch.cat([deltas["a.weight"].reshape(3, -1), deltas["a.bias"]], dim=1)
    n = torch.tensor([3, 1, 2])
    torch.testing.assert_close(fedalign_weights(deltas, n), fedalign_weights(flat, n))
    d = torch.tensor([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0]])
    w = fedalign_weights(d, torch.tensor([1, 1, 1]))
    assert float(w[2] / w[0]) < 0.0011  # eps / (cos + eps) with cos close to 1


# ====================================================================== strategies

"""The conflict-aware baselines' rules (:mod:`fedlearn_edu.aggregators.conflict`): q-FedAvg with a
large q, FedFV's refusals.

ConFIG's, FedFV's and q-FedAvg's defining properties are tested beside CRAFT's, in
tests/aggregators/test_craft.py.
"""

import math

import pytest
import torch

from fedlearn_edu.aggregators import fedfv_kept, qfedavg_step


def test_qfedavg_with_a_large_q_is_finite_and_right():
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    losses = torch.tensor([2.0, 3.0], dtype=torch.float64)
    out = qfedavg_step(g, losses, lr=0.1, q=1000.0)
    assert bool(torch.isfinite(out).all())
    # the written-out rule, in exact rational arithmetic on the ratios (F_0/F_1)^1000 ~ 1e-176
    from fractions import Fraction

    F = [Fraction(2), Fraction(3)]
    lr, q = Fraction(1, 10), 1000
    sq = [Fraction(1) / lr**2] * 2
    h = [q * f ** (q - 1) * s + f**q / lr for f, s in zip(F, sq)]
    coef = [float(f**q / lr / sum(h)) for f in F]
    torch.testing.assert_close(out, torch.tensor(coef, dtype=torch.float64))


def test_fedfv_kept_refuses_nan_alpha_and_nan_losses():
    with pytest.raises(ValueError, match="alpha"):
        fedfv_kept(torch.tensor([0.1, 0.2, 0.3]), math.nan)
    with pytest.raises(ValueError, match="losses"):
        fedfv_kept(torch.tensor([0.1, math.nan, 0.3]), 0.5)

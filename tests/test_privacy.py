"""The privacy accounting (:mod:`fedlearn_edu.privacy`): epsilon cross-checked with Opacus, its monotonicity and
its refusals. DP-FedAvg itself is tested in tests/strategies/test_dp.py."""

from __future__ import annotations

import re
import sys

import pytest

from fedlearn_edu import DPFedAvg


def _opacus_epsilon(rounds, q, z, delta):
    accountants = pytest.importorskip("opacus.accountants")
    acc = accountants.RDPAccountant()
    for _ in range(rounds):
        acc.step(noise_multiplier=z, sample_rate=q)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    "rounds, q, z, delta",
    [(100, 0.01, 1.1, 1e-5), (30, 0.5, 1.0, 1e-5), (50, 0.1, 0.8, 1e-6), (1, 1.0, 2.0, 1e-5), (200, 0.05, 1.5, 1e-5)],
)
def test_epsilon_agrees_with_opacus(rounds, q, z, delta):
    from fedlearn_edu.privacy import epsilon

    """dp_accounting's RDP accountant and Opacus's agree to 0.25 %: both compose the sampled Gaussian
    mechanism's RDP over the same orders; where they differ (large epsilon, e.g. 10.549 vs 10.532 at
    T=50, q=0.1, z=0.8) dp_accounting has dropped the lowest orders (1.1-1.6), whose series it could
    not converge (it logs so), so its bound is the looser one."""
    ours = epsilon(rounds, q, z, delta)
    theirs = _opacus_epsilon(rounds, q, z, delta)
    assert ours == pytest.approx(theirs, rel=2.5e-3)
    assert ours >= theirs * (1 - 1e-7)
    assert epsilon(rounds, q, z, delta, accountant="pld") <= ours * (1 + 1e-6)  # PLD is the tighter account


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    from fedlearn_edu.privacy import epsilon

    eps = [epsilon(t, 0.25, 1.0, 1e-5) for t in (1, 10, 100)]
    assert eps[0] < eps[1] < eps[2]
    assert epsilon(50, 0.25, 2.0, 1e-5) < epsilon(50, 0.25, 1.0, 1e-5)
    assert epsilon(0, 0.25, 1.0, 1e-5) == 0.0
    assert DPFedAvg(noise_multiplier=1.0).epsilon(10, 0.25, 1e-5) == eps[1]
    with pytest.raises(ValueError, match=r"sampling_rate must be in \(0, 1\]"):
        epsilon(10, 0.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="accountant must be one of"):
        epsilon(10, 0.5, 1.0, 1e-5, accountant="moments")


def test_missing_library_names_the_extra(monkeypatch):
    from fedlearn_edu.privacy import epsilon

    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    with pytest.raises(ImportError, match=r"the 'privacy' extra: pip install \"dp-accounting>=0.4\""):
        epsilon(10, 0.5, 1.0, 1e-5)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_an_epsilon_beyond_the_accountants_range_names_noise_multiplier(accountant):
    from fedlearn_edu.privacy import epsilon

    for z in (1e-300, 1e300):  # was: ZeroDivisionError / OverflowError from inside dp_accounting
        with pytest.raises(
            ValueError, match=rf"^noise_multiplier={re.escape(repr(z))} is beyond what the '{accountant}' accountant"
        ):
            epsilon(10, 0.5, z, 1e-5, accountant=accountant)

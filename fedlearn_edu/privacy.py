"""Privacy accounting for client-level DP-FedAvg, from Google's ``dp-accounting`` library (not by hand).

Needs the optional extra ``privacy``: ``pip install "dp-accounting>=0.4"`` (the test
suite cross-checks it against Opacus's ``RDPAccountant``). The core package imports neither.

One round of DP-FedAvg (:class:`fedlearn_edu.strategies.DPFedAvg`) is the *sampled Gaussian
mechanism*: each client takes part with probability q (the sampling rate m/N), its clipped
update has norm <= C, and the sum gets Gaussian noise of standard deviation z C. Rounds
compose. The accountants assume **Poisson sampling** (each client independently with
probability q); the simulator samples exactly m clients without replacement, which is
covered by the same q only approximately (for sampling without replacement under the
substitution relation the RDP bound differs, Wang, Balle & Kasiviswanathan 2019); the
figures are the standard ones reported for this setting, not a proof for the simulator's
sampler.

**Adaptive clipping** (``DPFedAvg(..., target_quantile=gamma, count_noise=sigma_b)``, Andrew
et al. 2021): each round releases two Gaussian sums of the same clients, the clipped updates
(noise multiplier z_Delta) and the unclipped count (noise sigma_b, sensitivity 1/2 for the
centred bits). Together they are one Gaussian mechanism with multiplier
``z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2)``; the strategy takes z as its ``noise_multiplier``
and derives z_Delta from it (:func:`fedlearn_edu.strategies.dp.split_noise_multiplier`), so
the run is accounted here with ``noise_multiplier=z``, as a fixed-clipping run.
"""

from __future__ import annotations

from .checks import check_int, check_positive, check_range

__all__ = ["epsilon", "ACCOUNTANTS"]

ACCOUNTANTS = ("rdp", "pld")
# The Renyi orders the RDP bound is minimised over (the grid Opacus uses too).
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def _dp_accounting():
    try:
        import dp_accounting  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(
            "fedlearn_edu.privacy needs the 'privacy' extra: pip install \"dp-accounting>=0.4\" "
            f"(its one dependency). ({err})"
        ) from None
    return dp_accounting


#: the smallest noise_multiplier the PLD accountant is asked about: its discretised privacy-loss
#: grid has about 1/z^2 points (z = 0.1: 2 GB and 20 s for 100 rounds; z = 1e-6: 35 PiB)
PLD_MIN_NOISE = 0.1


def epsilon(rounds: int, sampling_rate: float, noise_multiplier: float, delta: float, accountant: str = "rdp") -> float:
    """The epsilon at ``delta`` after ``rounds`` rounds of the sampled Gaussian mechanism (client-level DP).

    Args:
        rounds: T >= 0, the number of rounds (compositions).
        sampling_rate: q in ``(0, 1]``, a client's probability of taking part in a round (m / N).
        noise_multiplier: z > 0, the noise's standard deviation over the clipping norm.
        delta: delta in ``(0, 1)``.
        accountant: ``"rdp"`` (Renyi DP, Mironov 2017; Mironov, Talwar & Zhang 2019) or
            ``"pld"`` (privacy loss distributions, tighter), both from ``dp_accounting``.

    Returns:
        epsilon (0 for ``rounds = 0``).

    Raises:
        ImportError: ``dp-accounting`` is not installed (naming the extra).
        ValueError: an argument out of range, or settings beyond the accountant's numerical
            range (a ``noise_multiplier`` far below 1e-2 or above 1e100; for ``"pld"`` also
            many rounds), where ``dp_accounting`` stops with ZeroDivisionError or OverflowError;
            for ``"pld"`` a ``noise_multiplier`` below :data:`PLD_MIN_NOISE`, whose grid would not
            fit in memory (use ``"rdp"``).
    """
    rounds = check_int(rounds, "rounds", 0)
    q = check_range(sampling_rate, "sampling_rate", 0.0, 1.0, low_open=True)
    z = check_positive(noise_multiplier, "noise_multiplier")
    delta = check_range(delta, "delta", 0.0, 1.0, low_open=True, high_open=True)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}.")
    if accountant == "pld" and z < PLD_MIN_NOISE:
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} is beyond what the 'pld' accountant of dp_accounting can evaluate "
            f"in memory: the noise is too small for the PLD accountant (its grid grows as 1/noise_multiplier^2; "
            f"below {PLD_MIN_NOISE:g} it needs gigabytes, at 1e-6 petabytes): use accountant='rdp'."
        )
    dpa = _dp_accounting()
    if rounds == 0:
        return 0.0
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), rounds)
    if accountant == "rdp":
        from dp_accounting.rdp import RdpAccountant  # noqa: PLC0415

        acc = RdpAccountant(RDP_ORDERS)
    else:
        from dp_accounting.pld import PLDAccountant  # noqa: PLC0415

        acc = PLDAccountant()
    try:
        acc.compose(event)
        return float(acc.get_epsilon(delta))
    except (ZeroDivisionError, OverflowError, FloatingPointError) as err:
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} is beyond what the {accountant!r} accountant of dp_accounting "
            f"can evaluate over rounds={rounds} at sampling_rate={sampling_rate!r} ({type(err).__name__}: {err}); "
            "use a noise_multiplier between about 1e-100 and 1e100 (the 'pld' accountant also needs fewer rounds, "
            "and its memory grows as noise_multiplier shrinks: accountant='rdp' takes a wider range)."
        ) from None

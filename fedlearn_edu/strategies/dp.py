"""DP-FedAvg (McMahan, Ramage, Talwar & Zhang, ICLR 2018): client-level differential privacy.

Each round the server clips every client's update to norm C, adds them up, adds Gaussian
noise of standard deviation z C to the sum and divides by a **fixed** denominator D (the
number of clients per round for fixed-size sampling, or the expected number qN)::

    g = -(1/D) (sum_i Delta_i min(1, C / ||Delta_i||) + N(0, z^2 C^2 I))

Adding or removing one client changes the clipped sum by at most C (and not the
denominator, which is fixed), so the noise z C makes the round a Gaussian mechanism with
noise multiplier z; with sampling rate q = m/N the rounds compose as the sampled Gaussian
mechanism, accounted by :func:`fedlearn_edu.privacy.epsilon`.

**Weights and sensitivity.** The guarantee rests on each client moving the sum by at most
C. A weighted sum ``sum_i p_i Delta~_i`` has sensitivity ``max_j p_j C`` only if the weights
are fixed in advance: with p_i = n_i / sum_k n_k, removing client j changes every other p_i
(the sum moves by up to about ``2 max_j p_j C``), and data-dependent weights -- FedVG's inverse
validation-gradient norms, FedOUI's activation scores, even the n_i themselves, which are
private -- let one client's data change every other client's weight. A bound remains, but
only the trivial one: weights that sum to 1 keep the weighted average of clipped updates
within norm C, so one client moves it by at most 2C -- 2D times the C / D of DP-FedAvg's
fixed-denominator mean, and noise 2D times larger. The package **refuses** them: DP-FedAvg
weighs every clipped update alike with the fixed denominator, and a re-weighting strategy
built on it (``FedVG(base=DPFedAvg(...))``) is refused at construction. (McMahan et al. also
allow bounded weights ``w_i = min(n_i / w_hat, 1)`` fixed per client, with denominator
``q W``; not implemented here.)

**Adaptive clipping** (Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021), with
``target_quantile=gamma``: the clipping norm C_t lives in the server state (``"clip"``) and
follows the gamma-quantile of the update norms. Each client also reports the bit
``b_i = 1[||Delta_i|| <= C_t]``; the server forms the noisy fraction of unclipped updates
``b_bar = (sum_i b_i + N(0, sigma_b^2)) / D`` and takes the geometric step
``C_{t+1} = C_t exp(-eta_C (b_bar - gamma))`` (``clip_lr`` eta_C, ``count_noise`` sigma_b).
With ``sigma_b = 0`` and fixed norms, every C with a fraction gamma of the norms at or below
it is a fixed point (exp(0) = 1): C settles at the gamma-quantile of the norms. Privacy:
the count is a second Gaussian mechanism on the same clients (sensitivity 1/2 once the bits
are centred, ``b_i - 1/2``, a public shift for a fixed D); the paper's Theorem 1 accounts the
pair (updates with noise multiplier z_Delta, the count with sigma_b) as *one* Gaussian
mechanism with multiplier ``z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2)``. The package takes the
total z (``noise_multiplier``) and noises the update sum with
``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` (:func:`split_noise_multiplier`; it needs
``2 sigma_b > z``), so :func:`fedlearn_edu.privacy.epsilon` (and :meth:`DPFedAvg.epsilon`)
account the run with z, exactly as for fixed clipping.

The noise is drawn on the CPU from ``derive_seed(run seed, t, tag)`` (the run seed is kept in
the server state): the same run gives the same noise on every engine and device, and
:meth:`DPFedAvg.aggregate` stays a pure function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ..aggregators.robust import norm_clip, update_norms
from ..checks import check_int, check_positive, check_range
from ..params import Params
from ..utils import derive_seed
from .base import ClientUpdates, Needs, Strategy
from .registry import register
from .server_optim import ServerOptimizer
from .state import AdaptiveDPState, DPState, updated

__all__ = ["DPFedAvg", "split_noise_multiplier"]

_TAG_NOISE = 0xD9F3
_TAG_COUNT = 0xC0B7


def split_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """The update's noise multiplier z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. 2021).

    Noising the clipped-update sum with z_Delta C and the unclipped count with sigma_b makes
    the pair one Gaussian mechanism with noise multiplier z (the paper's Theorem 1).

    Args:
        noise_multiplier: z >= 0, the total noise multiplier the run is accounted with
            (0: no noise, z_Delta = 0).
        count_noise: sigma_b >= 0, the standard deviation of the noise on the count of
            unclipped updates; needs ``2 sigma_b > z`` when z > 0.

    Returns:
        z_Delta (>= z).

    Raises:
        ValueError: ``count_noise`` is too small for ``noise_multiplier`` (z_Delta undefined),
            or so close to ``noise_multiplier / 2`` (or ``noise_multiplier`` so large) that
            z_Delta overflows.

    Example:
        >>> round(split_noise_multiplier(1.0, 5.0), 6)  # (1 - 1/100)^(-1/2)
        1.005038
    """
    z = check_positive(noise_multiplier, "noise_multiplier", allow_zero=True)
    sigma_b = check_positive(count_noise, "count_noise", allow_zero=True)
    if z == 0:
        return 0.0
    if not 2 * sigma_b > z:
        raise ValueError(
            f"count_noise must be > noise_multiplier / 2 = {z / 2!r} for the update's noise multiplier "
            f"z_Delta = (z^-2 - (2 count_noise)^-2)^(-1/2) to exist, got {count_noise!r}."
        )
    try:
        return (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    except (OverflowError, ZeroDivisionError):  # z or sigma_b beyond the powers' range: the same, factored
        pass
    r = (z / 2) / sigma_b  # not z / (2 sigma_b): 2 sigma_b may overflow
    rest = 1.0 - r * r
    out = z / math.sqrt(rest) if rest > 0 else math.inf
    if not math.isfinite(out):
        raise ValueError(
            f"count_noise={count_noise!r} with noise_multiplier={noise_multiplier!r} gives an update noise multiplier "
            f"z_Delta = z (1 - (z / (2 count_noise))^2)^(-1/2) that overflows: use a count_noise well above "
            f"noise_multiplier / 2 = {z / 2!r}, or a smaller noise_multiplier."
        )
    return out


@register
class DPFedAvg(Strategy):
    """DP-FedAvg with a fixed clipping norm (McMahan et al., 2018); see the module docstring.

    Args:
        clip: C > 0, the clipping norm of every client's whole update (with adaptive
            clipping: C_0, the initial one).
        noise_multiplier: z >= 0 (0: clipping only, no privacy); with adaptive clipping the
            *total* multiplier the run is accounted with (the update sum gets z_Delta, see
            :func:`split_noise_multiplier`).
        denominator: D, the fixed integer (1 to 2**53) the noisy sum (and the noisy count) is divided by
            (``None``: the round's number of selected clients m, fixed for fixed-size sampling).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        target_quantile: gamma in ``[0, 1]``: adaptive clipping towards the gamma-quantile of
            the update norms (``None``, the default: fixed clipping at ``clip``).
        clip_lr: eta_C > 0, the geometric update's step size (adaptive clipping only;
            ``None``: the paper's default 0.2).
        count_noise: sigma_b >= 0, the noise on the count of unclipped updates (adaptive
            clipping only; ``None``: 0 without noise, and required, ``> z / 2``, with noise;
            the paper suggests about m / 20).

    Diagnostics: ``clipped`` (``Tensor[m]`` the factors ``min(1, C / ||Delta_i||)``) and
    ``noise_std`` (``z C / D``, the noise's standard deviation on the mean; ``z_Delta C_t / D``
    with adaptive clipping, which adds ``clip`` (C_t, the round's norm) and ``unclipped``
    (b_bar, the noisy fraction of updates with norm <= C_t)).

    Example:
        >>> strategy = DPFedAvg(clip=1.0, noise_multiplier=1.1)
        >>> adaptive = DPFedAvg(clip=0.1, noise_multiplier=1.0, target_quantile=0.5, count_noise=2.0)
        >>> round(adaptive.update_noise_multiplier, 4)  # z_Delta = (1 - 1/16)^(-1/2)
        1.0328
    """

    name = "dpfedavg"
    # the clipped updates' sum (clients clip; the server adds noise); private: re-weighting
    # wrappers refuse to build on it (check_base)
    needs = Needs(sums_only=True, private=True)

    def __init__(
        self,
        clip: float = 1.0,
        noise_multiplier: float = 1.0,
        denominator: int | None = None,
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        target_quantile: float | None = None,
        clip_lr: float | None = None,
        count_noise: float | None = None,
    ):
        """Check the arguments (see the class docstring) and keep them.

        Raises:
            TypeError: an argument of the wrong type.
            ValueError: an argument out of range; ``noise_multiplier * clip`` (the noise's
                standard deviation) overflows; ``clip_lr`` or ``count_noise`` without
                ``target_quantile``; ``count_noise`` too small for ``noise_multiplier``.
        """
        super().__init__(server_lr, optimizer)
        self.clip = check_positive(clip, "clip")
        self.noise_multiplier = check_positive(noise_multiplier, "noise_multiplier", allow_zero=True)
        if not math.isfinite(self.noise_multiplier * self.clip):
            raise ValueError(
                f"noise_multiplier * clip, the noise's standard deviation, overflows: {noise_multiplier!r} * "
                f"{clip!r}; lower noise_multiplier (or clip)."
            )
        self.denominator = None if denominator is None else check_int(denominator, "denominator", 1, maximum=2**53)
        # Kept private (with read-only properties) so that a fixed-clipping DPFedAvg's repr,
        # which run settings and checkpoints record, is what it was.
        self._adaptive = None
        if target_quantile is None:
            for name, value in (("clip_lr", clip_lr), ("count_noise", count_noise)):
                if value is not None:
                    raise ValueError(f"{name} is for adaptive clipping; give target_quantile too (got {value!r}).")
            return
        gamma = check_range(target_quantile, "target_quantile", 0.0, 1.0)
        eta = check_positive(0.2 if clip_lr is None else clip_lr, "clip_lr")
        if count_noise is None:
            if self.noise_multiplier > 0:
                raise ValueError(
                    f"count_noise must be given with target_quantile={target_quantile!r} (adaptive clipping) and "
                    "noise_multiplier > 0 "
                    f"(> noise_multiplier / 2 = {self.noise_multiplier / 2!r}; about m / 20 in the paper), got None."
                )
            count_noise = 0.0
        sigma_b = check_positive(count_noise, "count_noise", allow_zero=True)
        z_delta = split_noise_multiplier(self.noise_multiplier, sigma_b)  # refuses a too small sigma_b
        if not math.isfinite(z_delta * self.clip):
            raise ValueError(
                f"the update's noise multiplier z_Delta = {z_delta!r} (from noise_multiplier={noise_multiplier!r} and "
                f"count_noise={count_noise!r}) times clip={clip!r} overflows: lower noise_multiplier (or clip)."
            )
        self._adaptive = (gamma, eta, sigma_b)

    @property
    def adaptive(self) -> bool:
        """Whether the clipping norm adapts (``target_quantile`` was given)."""
        return self._adaptive is not None

    @property
    def target_quantile(self) -> float | None:
        """The target quantile gamma (``None`` for fixed clipping)."""
        return None if self._adaptive is None else self._adaptive[0]

    @property
    def clip_lr(self) -> float | None:
        """The clipping norm's step size eta_C (``None`` for fixed clipping)."""
        return None if self._adaptive is None else self._adaptive[1]

    @property
    def count_noise(self) -> float | None:
        """The count's noise sigma_b (``None`` for fixed clipping)."""
        return None if self._adaptive is None else self._adaptive[2]

    @property
    def update_noise_multiplier(self) -> float:
        """The multiplier of the update sum's noise: z (fixed clipping) or z_Delta (adaptive)."""
        if self._adaptive is None:
            return self.noise_multiplier
        return split_noise_multiplier(self.noise_multiplier, self._adaptive[2])

    def __repr__(self) -> str:
        """``DPFedAvg(clip=..., ...)``, with the adaptive-clipping arguments when given."""
        out = super().__repr__()
        if self._adaptive is None:
            return out
        gamma, eta, sigma_b = self._adaptive
        return f"{out[:-1]}, target_quantile={gamma!r}, clip_lr={eta!r}, count_noise={sigma_b!r})"

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """FedAvg's server state plus ``noise_seed`` (the run's seed, for the round's noise).

        Args:
            params: theta_0.
            model: the architecture.
            num_clients: N.
            seed: the run's seed.

        Returns:
            ``(server_state, {})``: a :class:`~fedlearn_edu.strategies.state.DPState`; with
            adaptive clipping an :class:`~fedlearn_edu.strategies.state.AdaptiveDPState`, which
            also holds ``clip``, C_t (a Python float, C_0 = ``clip``).
        """
        server, clients = super().init_state(params, model, num_clients, seed)
        if self._adaptive is None:
            return DPState(**server, noise_seed=int(seed)), clients
        return AdaptiveDPState(**server, noise_seed=int(seed), clip=self.clip), clients

    def noise(self, like: Params, seed: int, round: int, clip: float | None = None) -> Params:
        """The round's Gaussian noise ``N(0, (z C)^2 I)`` shaped like ``like``, drawn on the CPU.

        With adaptive clipping the multiplier is z_Delta (:attr:`update_noise_multiplier`).

        Args:
            like: ``{name: Tensor}`` (shapes, dtype and device of the result).
            seed: the run's seed.
            round: t.
            clip: the round's clipping norm (``None``: ``self.clip``).

        Returns:
            ``{name: Tensor}``.
        """
        g = torch.Generator().manual_seed(derive_seed(seed, round, _TAG_NOISE))
        std = self.update_noise_multiplier * (self.clip if clip is None else float(clip))
        return {
            k: (std * torch.randn(v.shape, generator=g, dtype=torch.float64)).to(device=v.device, dtype=v.dtype)
            for k, v in like.items()
        }

    def next_clip(self, clip: float, norms: Tensor, denominator: int, seed: int, round: int) -> tuple[float, float]:
        """Adaptive clipping's step: ``C exp(-eta_C (b_bar - gamma))``, b_bar the noisy unclipped fraction.

        Args:
            clip: C_t.
            norms: ``Tensor[m]`` the round's update norms ``||Delta_i||``.
            denominator: D.
            seed: the run's seed (the count's noise: ``derive_seed(seed, t, tag)``, CPU float64).
            round: t.

        Returns:
            ``(C_{t+1}, b_bar)`` with ``b_bar = (sum_i 1[||Delta_i|| <= C_t] + N(0, sigma_b^2)) / D``.

        Raises:
            RuntimeError: the strategy clips with a fixed norm.
            FloatingPointError: ``C_{t+1}`` overflows or underflows to 0 (a ``clip_lr`` too large
                for the norms, or a huge ``count_noise``); the message names the round and them.
        """
        if self._adaptive is None:
            raise RuntimeError("next_clip is for adaptive clipping (DPFedAvg(..., target_quantile=gamma)).")
        gamma, eta, sigma_b = self._adaptive
        count = float((norms.double().cpu() <= clip).sum())
        if sigma_b > 0:
            g = torch.Generator().manual_seed(derive_seed(seed, round, _TAG_COUNT))
            count += sigma_b * float(torch.randn((), generator=g, dtype=torch.float64))
        b_bar = count / denominator
        try:
            new = float(clip) * math.exp(-eta * (b_bar - gamma))
        except OverflowError:
            new = math.inf
        if not 0 < new < math.inf:
            noisy = (
                f" or count_noise (now {sigma_b!r}, which moves b_bar by about {sigma_b / denominator:.3g})"
                if sigma_b
                else ""
            )
            raise FloatingPointError(
                f"Round {round}: adaptive clipping's norm C exp(-clip_lr (b_bar - gamma)) = {float(clip):.4g} "
                f"exp(-{eta:g} * ({b_bar:.4g} - {gamma:g})) {'overflows' if new else 'underflows to 0'}: "
                f"lower clip_lr (now {eta!r}; the paper uses 0.2){noisy}."
            )
        return new, b_bar

    def nonfinite_hint(self) -> str:
        """The noise's standard deviation z C overflowed the parameters' dtype: lower z (or C, or eta_C)."""
        adaptive = f", or clip_lr (now {self._adaptive[1]!r}), which moves C" if self._adaptive else ""
        return (
            f"DP-FedAvg's noise has standard deviation noise_multiplier * clip (now {self.update_noise_multiplier!r} * "
            f"{self.clip!r}{' at the start' if self._adaptive else ''}), too large for the parameters' dtype: lower "
            f"noise_multiplier (or clip{adaptive})."
        )

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -(sum of clipped updates + noise) / D`` (and, adaptive, the next clipping norm).

        Args:
            server_state: with ``params`` and ``noise_seed`` (and ``clip``, adaptive; not modified).
            updates: the round's updates.

        Returns:
            ``(g, server_state, {"clipped": factors, "noise_std": z C / D})``; adaptive: the
            new server state holds C_{t+1} (:meth:`next_clip`) and the diagnostics add
            ``clip`` (C_t) and ``unclipped`` (b_bar).
        """
        clip = self.clip if self._adaptive is None else float(server_state["clip"])
        clipped, factors = norm_clip(updates.deltas, clip, check=not updates.checked)
        total = {k: v.sum(dim=0) for k, v in clipped.items()}
        noise = self.noise(total, server_state["noise_seed"], updates.round, clip)
        d = updates.num_clients if self.denominator is None else self.denominator
        g = {k: -(total[k] + noise[k]) / d for k in total}
        diag = {"clipped": factors, "noise_std": self.update_noise_multiplier * clip / d}
        if self._adaptive is None:
            return g, server_state, diag
        norms = update_norms(updates.deltas, check=not updates.checked)
        new_clip, b_bar = self.next_clip(clip, norms, d, server_state["noise_seed"], updates.round)
        return g, updated(server_state, clip=new_clip), {**diag, "clip": clip, "unclipped": b_bar}

    def epsilon(self, rounds: int, sampling_rate: float, delta: float, accountant: str = "rdp") -> float:
        """The epsilon at ``delta`` after ``rounds`` rounds at sampling rate q (:func:`fedlearn_edu.privacy.epsilon`).

        Accounted with the total noise multiplier z (``noise_multiplier``), also under adaptive
        clipping (the update sum's z_Delta and the count's sigma_b together are one Gaussian
        mechanism with multiplier z; see the module docstring).

        Args:
            rounds: T.
            sampling_rate: q = m / N.
            delta: delta.
            accountant: ``"rdp"`` or ``"pld"``.

        Returns:
            epsilon.
        """
        from ..privacy import epsilon  # noqa: PLC0415

        return epsilon(rounds, sampling_rate, self.noise_multiplier, delta, accountant)

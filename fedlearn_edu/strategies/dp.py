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
private -- let one client's data change every other client's weight, with no bound the noise
covers. The package **refuses** them: DP-FedAvg weighs every clipped update alike with the
fixed denominator, and a re-weighting strategy built on it (``FedVG(base=DPFedAvg(...))``) is
refused at construction. (McMahan et al. also allow bounded weights ``w_i = min(n_i / w_hat, 1)``
fixed per client, with denominator ``q W``; not implemented here.)

The noise is drawn on the CPU from ``derive_seed(run seed, t, tag)`` (the run seed is kept in
the server state): the same run gives the same noise on every engine and device, and
:meth:`DPFedAvg.aggregate` stays a pure function.
"""

from __future__ import annotations

import torch
from torch import nn

from ..aggregators.robust import norm_clip
from ..checks import check_float, check_int
from ..params import Params
from ..utils import derive_seed
from .base import ClientUpdates, Needs, Strategy
from .server_optim import ServerOptimizer

__all__ = ["DPFedAvg"]

_TAG_NOISE = 0xD9F3


class DPFedAvg(Strategy):
    """DP-FedAvg with a fixed clipping norm (McMahan et al., 2018); see the module docstring.

    Args:
        clip: C > 0, the clipping norm of every client's whole update.
        noise_multiplier: z >= 0 (0: clipping only, no privacy).
        denominator: D, the fixed number the noisy sum is divided by (``None``: the round's
            number of selected clients m, fixed for fixed-size sampling).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).

    Diagnostics: ``clipped`` (``Tensor[m]`` the factors ``min(1, C / ||Delta_i||)``) and
    ``noise_std`` (``z C / D``, the noise's standard deviation on the mean).

    Example:
        >>> strategy = DPFedAvg(clip=1.0, noise_multiplier=1.1)
    """

    name = "dpfedavg"
    needs = Needs(sums_only=True)  # the clipped updates' sum (clients clip; the server adds noise)
    private = True  # re-weighting strategies refuse to build on it (check_base)

    def __init__(
        self,
        clip: float = 1.0,
        noise_multiplier: float = 1.0,
        denominator: int | None = None,
        server_lr: float = 1.0,
        optimizer: ServerOptimizer | None = None,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer)
        self.clip = check_float(clip, "clip", positive=True)
        self.noise_multiplier = check_float(noise_multiplier, "noise_multiplier", nonnegative=True)
        self.denominator = None if denominator is None else check_int(denominator, "denominator", 1)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[dict, dict]:
        """FedAvg's server state plus ``noise_seed`` (the run's seed, for the round's noise).

        Args:
            params: theta_0.
            model: the architecture.
            num_clients: N.
            seed: the run's seed.

        Returns:
            ``(server_state, {})``.
        """
        server, clients = super().init_state(params, model, num_clients, seed)
        return {**server, "noise_seed": int(seed)}, clients

    def noise(self, like: Params, seed: int, round: int) -> Params:
        """The round's Gaussian noise ``N(0, (z C)^2 I)`` shaped like ``like``, drawn on the CPU.

        Args:
            like: ``{name: Tensor}`` (shapes, dtype and device of the result).
            seed: the run's seed.
            round: t.

        Returns:
            ``{name: Tensor}``.
        """
        g = torch.Generator().manual_seed(derive_seed(seed, round, _TAG_NOISE))
        std = self.noise_multiplier * self.clip
        return {
            k: (std * torch.randn(v.shape, generator=g, dtype=torch.float64)).to(device=v.device, dtype=v.dtype)
            for k, v in like.items()
        }

    def direction(self, server_state: dict, updates: ClientUpdates) -> tuple[Params, dict, dict]:
        """``g = -(sum of clipped updates + noise) / D``.

        Args:
            server_state: with ``params`` and ``noise_seed`` (not modified).
            updates: the round's updates.

        Returns:
            ``(g, server_state, {"clipped": factors, "noise_std": z C / D})``.
        """
        clipped, factors = norm_clip(updates.deltas, self.clip)
        total = {k: v.sum(dim=0) for k, v in clipped.items()}
        noise = self.noise(total, server_state["noise_seed"], updates.round)
        d = updates.num_clients if self.denominator is None else self.denominator
        g = {k: -(total[k] + noise[k]) / d for k in total}
        return g, server_state, {"clipped": factors, "noise_std": self.noise_multiplier * self.clip / d}

    def epsilon(self, rounds: int, sampling_rate: float, delta: float, accountant: str = "rdp") -> float:
        """The epsilon at ``delta`` after ``rounds`` rounds at sampling rate q (:func:`fedlearn_edu.privacy.epsilon`).

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

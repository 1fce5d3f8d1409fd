"""FedOUI (OUI-guided client weighting) and its FedAlign baseline.

Both keep FedAvg's clients and change only the weights of the server's average:

* :class:`FedOUI` -- clients report the OUI of their trained model on a fixed probe batch
  of their own training data (a scalar: no data leaves the client); the server weighs
  ``w_k ∝ n_k (eps + s_k)`` with ``s_k`` the centrality of ``o_k`` under a Beta fitted to
  the round's OUI values.
* :class:`FedAlign` -- ``w_k ∝ n_k (max(cos(Delta_k, Delta_bar), 0) + eps)``.

In both, ``theta_{t+1} = theta_t + eta_s sum_k w_k Delta_k`` with ``Delta_k = theta_k - theta_t``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from ..aggregators import fedalign_weights, fedavg
from ..aggregators.fedoui import scores_and_fit, weights_from_scores
from ..checks import check_int, check_positive, check_seed
from ..engine import LocalResult
from ..params import Params
from ..signals.oui import MAX_PROBE_SIZE, client_oui, hooked_module, probe_batch
from .base import ClientUpdates, Needs, Strategy
from .registry import register

__all__ = ["FedOUI", "FedAlign"]


@register
class FedOUI(Strategy):
    """FedOUI (Fernandez-Hernandez et al., 2026): weigh clients by how typical their OUI is.

    Client side (:meth:`client_signals`): after local training, client k evaluates its
    trained parameters ``theta_k`` in eval mode on its fixed probe batch -- the first
    ``probe_size`` samples of a seeded shuffle of its own training split
    (:func:`fedlearn_edu.signals.probe_indices`; the same samples every round) -- and
    reports ``o_k = OUI`` of the penultimate pre-activations
    (:func:`fedlearn_edu.signals.oui`).

    Server side (:meth:`aggregate`): ``w = fedoui_weights(o, n, eps)`` and
    ``theta <- theta + eta_s * sum_k w_k Delta_k``.

    Args:
        probe_size: B, samples in the probe batch (32; at most ``MAX_PROBE_SIZE``, 100000).
        eps: floor of the structural score in the weights (1e-3).
        probe_seed: seed of the probe shuffle.
        layer: ``None`` reads ``model(x, features=True)``; or a submodule name to hook.
        server_lr: eta_s.

    Diagnostics per round: ``weights``, ``oui``, ``scores`` (``Tensor[m]``), ``beta_alpha``,
    ``beta_beta`` (NaN when no Beta was fitted) and ``fit_method``
    (``"moments"``, ``"mle"`` or ``"empirical"``).

    Example:
        >>> strategy = FedOUI(probe_size=32, eps=1e-3)
    """

    name = "fedoui"
    needs = Needs(signals={"oui"})

    def __init__(
        self,
        probe_size: int = 32,
        eps: float = 1e-3,
        probe_seed: int = 0,
        layer: str | None = None,
        server_lr: float = 1.0,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        if layer is not None and not isinstance(layer, str):
            raise TypeError(f"layer must be None or a submodule name (str), got {layer!r}.")
        self.probe_size = check_int(probe_size, "probe_size", 2, MAX_PROBE_SIZE)
        self.eps = check_positive(eps, "eps")
        self.probe_seed = check_seed(probe_seed, "probe_seed")
        self.layer = layer

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """:meth:`Strategy.init_state`, after checking that ``layer`` (if any) is a submodule of ``model``.

        Args:
            params: theta_0, ``{name: Tensor}``.
            model: the architecture.
            num_clients: N.
            seed: the run's seed.

        Returns:
            ``(server_state, client_state)``.

        Raises:
            ValueError: ``model`` has no submodule named ``layer`` (before round 1, not in it).
        """
        if self.layer is not None:
            hooked_module(model, self.layer)
        return super().init_state(params, model, num_clients, seed)

    def client_signals(
        self, model: nn.Module, global_params: Params, local: LocalResult, datasets: Sequence[tuple[Tensor, Tensor]]
    ) -> dict:
        """``{"oui": Tensor[m]}``: each client's OUI on its own fixed probe batch.

        Args:
            model: the architecture (its features, or the hooked ``layer``, give the OUI).
            global_params: theta_t (unused: the OUI is of the locally trained models).
            local: the clients' local training; ``local.params`` ``{name: Tensor[m, ...]}``.
            datasets: the m clients' training sets ``(x: Tensor[n_i, ...], y)``; each probe is
                ``probe_size`` rows of ``x`` drawn with ``probe_seed``.

        Returns:
            ``{"oui": Tensor[m]}``.
        """
        probes = torch.stack([probe_batch(x, self.probe_size, self.probe_seed) for x, _ in datasets])
        # a diverged client reports NaN, which the driver sees (and drops with on_nonfinite="skip")
        return {"oui": client_oui(model, local.params, probes, layer=self.layer, nan_rows=True)}

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -sum_k w_k Delta_k`` with FedOUI's weights; the state unchanged.

        Args:
            server_state: the server state.
            updates: the round's updates, with ``signals["oui"]`` (``Tensor[m]``).

        Returns:
            ``(g, server_state, diagnostics)``.
        """
        if "oui" not in updates.signals:
            raise ValueError(
                "FedOUI.aggregate needs updates.signals['oui'] (Tensor[m]); "
                "run it through simulate(), or compute it with FedOUI.client_signals."
            )
        o = torch.as_tensor(updates.signals["oui"], dtype=torch.float64)
        scores, alpha, beta, method = scores_and_fit(o)
        w = weights_from_scores(scores, updates.num_samples, self.eps)
        step = fedavg(updates.deltas, w, check=not updates.checked)
        return (
            {k: -v for k, v in step.items()},
            server_state,
            {
                "weights": w,
                "oui": o.cpu(),
                "scores": scores.cpu(),
                "beta_alpha": alpha,
                "beta_beta": beta,
                "fit_method": method,
            },
        )


@register
class FedAlign(Strategy):
    """FedAlign (the FedOUI paper's baseline): weigh clients by agreement with the mean update.

    ``w_k ∝ n_k (max(cos(Delta_k, Delta_bar), 0) + eps)`` with ``Delta_bar`` the size-weighted
    mean (:func:`fedlearn_edu.aggregators.fedalign_weights`);
    ``theta <- theta + eta_s * sum_k w_k Delta_k``.

    Args:
        eps: floor added to the clipped cosine (1e-3).
        server_lr: eta_s.

    Example:
        >>> strategy = FedAlign(eps=1e-3)
    """

    name = "fedalign"

    def __init__(self, eps: float = 1e-3, server_lr: float = 1.0):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        self.eps = check_positive(eps, "eps")

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -sum_k w_k Delta_k`` with FedAlign's weights; the state unchanged.

        Args:
            server_state: the server state (returned as given).
            updates: the round's updates: ``deltas`` ``{name: Tensor[m, ...]}`` and
                ``num_samples`` ``Tensor[m]``.

        Returns:
            ``(g, server_state, {"weights": Tensor[m]})``, ``g`` ``{name: Tensor}`` shaped like theta_t.
        """
        w = fedalign_weights(updates.deltas, updates.num_samples, self.eps, check=not updates.checked)
        step = fedavg(updates.deltas, w, check=not updates.checked)
        return {k: -v for k, v in step.items()}, server_state, {"weights": w.cpu()}

"""Conflict-aware baselines: ConFIG, FedFV and q-FedAvg as server strategies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor, nn

from ..aggregators import config_direction, fedfv_direction, qfedavg_step
from ..checks import check_bool, check_positive, check_range
from ..engine import LocalResult
from ..params import Params
from ..signals import global_model_loss
from .base import ClientUpdates, Needs, Strategy
from .craft import craft_layer_groups
from .registry import register

__all__ = ["ConFIG", "FedFV", "QFedAvg"]


@register
class ConFIG(Strategy):
    """ConFIG (Liu et al., 2025) as a server rule.

    ``theta <- theta - eta_s g``, ``g = (sum_i g_i . g_u) g_u``, ``g_u = normalise(U^+ 1)``, with pseudo-gradients
    ``g_i = -Delta_i`` (see :func:`fedlearn_edu.aggregators.config_direction`).
    Note that ``||g||`` grows with m (a *sum* of projections), so eta_s ~ 1/m gives
    steps the size of FedAvg's.

    Args:
        server_lr: eta_s.
        layerwise: one problem per layer group (CRAFT's groups) instead of the whole model.
    """

    name = "config"

    def __init__(self, server_lr: float = 1.0, layerwise: bool = False):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        self.layerwise = check_bool(layerwise, "layerwise")

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """ConFIG's direction from the pseudo-gradients ``-Delta_i``; the state unchanged.

        Args:
            server_state: the server state; ``"params"`` (``{name: Tensor}``) names the
                parameters of the whole-model group.
            updates: the round's updates, ``deltas`` ``{name: Tensor[m, ...]}``; ``model``
                gives CRAFT's layer groups with ``layerwise=True`` (``None``: one group per
                parameter tensor).

        Returns:
            ``(g, server_state, {})``: ``g`` ``{name: Tensor}`` shaped like theta_t, the state
            as given, no diagnostics.
        """
        params = server_state["params"]
        pseudo = {k: -v for k, v in updates.deltas.items()}
        if self.layerwise and updates.model is not None:
            groups = craft_layer_groups(updates.model)
        elif self.layerwise:
            groups = None  # per parameter tensor
        else:
            groups = {"model": list(params)}
        return config_direction(pseudo, groups=groups), server_state, {}


class GlobalLossSignal(Strategy):
    """Clients report F_k(theta_t): the received global model's loss on their training data."""

    needs = Needs(signals={"global_loss"})

    def client_signals(
        self, model: nn.Module, global_params: Params, local: LocalResult, datasets: Sequence[tuple[Tensor, Tensor]]
    ) -> dict:
        """``{"global_loss": Tensor[m]}``: ``F_k(theta_t)`` on each client's training data.

        Args:
            model: the architecture.
            global_params: theta_t ``{name: Tensor}``, the model whose loss is reported.
            local: the clients' local training (unused).
            datasets: the m clients' training sets ``(x: Tensor[n_i, ...], y: Tensor[n_i])``.

        Returns:
            ``{"global_loss": Tensor[m]}``.
        """
        return {"global_loss": global_model_loss(model, global_params, datasets)}


@register
class FedFV(GlobalLossSignal):
    """FedFV (Wang et al., 2021): fair averaging by projecting off conflicting updates.

    Clients sorted by loss; all but the ``alpha``-share with the highest loss are
    projected off the updates they conflict with; the projected updates are averaged
    (uniformly) and rescaled to the length of the plain uniform mean; ``theta <-
    theta - eta_s g`` (see :func:`fedlearn_edu.aggregators.fedfv_direction`).

    Args:
        server_lr: eta_s.
        alpha: share of highest-loss clients left unprojected (0.1).
        loss: which loss sorts the clients: ``"global"`` (default, as in FedFV's code:
            the received global model's loss on the client's training data, computed
            by the clients) or ``"local"`` (the mean mini-batch loss during local
            training, ``ClientUpdates.train_loss``: no extra forward pass).
    """

    name = "fedfv"

    def __init__(self, server_lr: float = 1.0, alpha: float = 0.1, loss: str = "global"):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        alpha = check_range(alpha, "alpha", 0, 1)
        if loss not in ("global", "local"):
            raise ValueError(f"loss must be 'global' or 'local', got {loss!r}.")
        self.alpha = float(alpha)
        self.loss = loss

    @property
    def needs(self) -> Needs:
        """``global_loss`` signals with ``loss="global"``, none with ``loss="local"``."""
        return Needs(signals={"global_loss"}) if self.loss == "global" else Needs()

    def client_signals(self, model, global_params, local, datasets) -> dict:
        """The global model's losses with ``loss="global"`` (else none).

        Args:
            model: the architecture.
            global_params: theta_t ``{name: Tensor}``.
            local: the clients' local training (unused).
            datasets: the m clients' training sets.

        Returns:
            ``{"global_loss": Tensor[m]}`` with ``loss="global"``, ``{}`` with ``loss="local"``.
        """
        return super().client_signals(model, global_params, local, datasets) if self.loss == "global" else {}

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """FedFV's projected, rescaled mean; the state unchanged; diagnostics ``losses``.

        Args:
            server_state: the server state (returned as given).
            updates: the round's updates: ``deltas`` ``{name: Tensor[m, ...]}`` and the losses
                that sort the clients, ``signals["global_loss"]`` (``loss="global"``) or
                ``train_loss`` (``loss="local"``), ``Tensor[m]``.

        Returns:
            ``(g, server_state, {"losses": Tensor[m]})``, ``g`` ``{name: Tensor}`` shaped like theta_t.
        """
        losses = updates.signals["global_loss"] if self.loss == "global" else updates.train_loss
        pseudo = {k: -v for k, v in updates.deltas.items()}
        return fedfv_direction(pseudo, losses, self.alpha), server_state, {"losses": losses}


@register
class QFedAvg(GlobalLossSignal):
    """q-FedAvg (Li et al., 2020): q-fair federated learning.

    ``theta <- theta - eta_s * sum_k F_k^q Delta W_k / sum_k h_k`` with
    ``Delta W_k = (theta_t - theta_k) / lr`` and ``h_k = q F_k^(q-1) ||Delta W_k||^2 +
    F_k^q / lr`` (see :func:`fedlearn_edu.aggregators.qfedavg_step`). The clients
    report ``F_k(theta_t)``, the global model's loss on their training data; the
    client learning rate of the round comes with the updates (``updates.config.lr``).

    Args:
        q: fairness parameter (0: uniform FedAvg; larger: more weight on high-loss clients).
        server_lr: eta_s (1 in q-FedAvg).
    """

    name = "qfedavg"

    def __init__(self, q: float = 1.0, server_lr: float = 1.0):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        self.q = check_positive(q, "q", allow_zero=True)

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """q-FedAvg's step (as a direction); the state unchanged; diagnostics ``losses``.

        Args:
            server_state: the server state (returned as given).
            updates: the round's updates: ``deltas`` ``{name: Tensor[m, ...]}``,
                ``signals["global_loss"]`` ``Tensor[m]`` (``F_k(theta_t)``) and ``config.lr``.

        Returns:
            ``(g, server_state, {"losses": Tensor[m]})``, ``g`` ``{name: Tensor}`` shaped like theta_t.

        Raises:
            ValueError: ``updates.config`` is ``None`` or ``updates.signals`` has no ``"global_loss"``.
        """
        if updates.config is None:
            raise ValueError(
                "QFedAvg needs the clients' lr: pass ClientUpdates(..., config=LocalTraining(lr=...)) "
                "(the simulator does)."
            )
        if "global_loss" not in updates.signals:
            raise ValueError("QFedAvg needs updates.signals['global_loss'] (F_k(theta_t)); client_signals computes it.")
        losses = updates.signals["global_loss"]
        pseudo = {k: -v for k, v in updates.deltas.items()}
        return qfedavg_step(pseudo, losses, updates.config.lr, self.q), server_state, {"losses": losses}

    def nonfinite_hint(self) -> str:
        """Lower q."""
        return f"q-FedAvg's weights F_k^q overflow for large q (q = {self.q:g}): lower q."

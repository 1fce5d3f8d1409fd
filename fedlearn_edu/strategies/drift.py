"""The classic repairs of client drift as strategies: SCAFFOLD, FedDyn and FedNova.

Each strategy wires the pure math of :mod:`fedlearn_edu.aggregators` (``scaffold``,
``feddyn``, ``fednova``) into the round protocol of :mod:`fedlearn_edu.strategies.base`:

==========  ==========================================================================
SCAFFOLD    client state ``control`` (c_i, ``{name: Tensor[N, ...]}``), server state
            ``"control"`` (c);
            clients minimise ``CE + <c - c_i, w>`` (the engines' ``linear`` term) and
            return ``c_i+`` (option II) and ``Delta c_i``; the server moves along the
            mean ``Delta y_i`` and sets ``c <- c + (1/N) sum_S Delta c_i``.
FedDyn      client state ``gradient`` (phi_k), server state ``"h"``; clients minimise
            ``CE - <phi_k, w> + (alpha/2)||w - theta_t||^2`` (``linear = -phi_k``,
            ``prox_mu = alpha``) and return ``phi_k - alpha Delta_k``; the server steps to
            ``mean_S theta_k - h+/alpha``.
FedNova     clients report their number of local steps ``tau_i``; the server takes the
            normalised average ``tau_eff sum_i p_i Delta_i / ||a_i||_1``.
==========  ==========================================================================

SCAFFOLD and FedDyn average the deltas uniformly (as in the papers) unless a weighting is
passed to their ``direction`` (``weights=``, declared by ``needs.weighted_direction``): that is how
FedVG composes with them
(``FedVG(val, base=SCAFFOLD())``, FedVG's weights replacing the uniform mean while the
control variates / the state h keep the papers' ``1/N`` updates).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ..aggregators import (
    feddyn_client_update,
    feddyn_server_update,
    fednova_aggregate,
    fednova_tau_eff,
    scaffold_control_update,
    scaffold_server_update,
)
from ..aggregators.fednova import PROX_TAU_EFF
from ..checks import check_positive
from ..engine import LocalTraining
from ..params import Params
from .base import ClientOutput, ClientUpdates, ClientWork, Needs, Strategy
from .fedavg import FedAvg
from .registry import register
from .server_optim import ServerOptimizer
from .state import FedDynState, SCAFFOLDState, updated

__all__ = ["SCAFFOLD", "FedDyn", "FedNova"]


def _zeros_stacked(params: Params, n: int) -> Params:
    """``{name: Tensor[n, ...]}`` of zeros shaped like ``n`` copies of ``params``."""
    return {k: torch.zeros((n, *v.shape), dtype=v.dtype, device=v.device) for k, v in params.items()}


def _check_weights_arg(weights) -> None:
    """Refuse ``weights`` that are not ``None`` or a ``Tensor[m]``."""
    if weights is not None and (not isinstance(weights, Tensor) or weights.dim() != 1):
        raise ValueError(
            "weights must be a Tensor[m] of per-client weights (client-wise FedVG); "
            f"got {type(weights).__name__} of shape {tuple(getattr(weights, 'shape', ()))}."
        )


def _used_weights(updates: ClientUpdates, weights: Tensor | None) -> Tensor:
    """``Tensor[m]``: the weights of the round's mean (uniform, or ``weights`` normalised)."""
    m = updates.num_clients
    return torch.full((m,), 1.0 / m) if weights is None else weights / weights.sum()


def _local_steps(updates: ClientUpdates, who: str) -> Tensor:
    """``Tensor[m]``: the clients' local step counts (``signals["num_steps"]``), or a clear error."""
    if "num_steps" not in updates.signals:
        raise ValueError(f"{who} needs updates.signals['num_steps'] (Tensor[m]); its client_update reports it.")
    return updates.signals["num_steps"]


@register
class SCAFFOLD(Strategy):
    """SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates.

    Client i starts from ``y_i = x``, takes K_i local steps along ``g_i(y) - c_i + c`` and
    updates ``c_i+ = c_i - c + (x - y_i) / (K_i eta_l)``
    (:func:`~fedlearn_edu.aggregators.scaffold_control_update`); the server sets
    ``x <- x + eta_g (1/|S|) sum_S Delta y_i`` and ``c <- c + (1/N) sum_S Delta c_i``
    (:func:`~fedlearn_edu.aggregators.scaffold_server_update`), so ``c`` stays the mean of
    all N client controls. Controls start at zero.

    Option II reads ``(x - y_i) / (K_i eta_l)`` as the average corrected gradient along the
    client's path: exact for plain local SGD (``momentum=0``). With momentum or weight decay
    the update still runs, but ``c_i`` is then that average of the *applied* steps.

    Args:
        server_lr: eta_g (1 in the paper's experiments).
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).

    Client state: ``control`` (``{name: Tensor[N, ...]}``). Diagnostics: ``weights``
    (``Tensor[m]``, uniform) and ``control_norm`` (``||c||``).

    Example:
        >>> from fedlearn_edu import federated_dataset, make_model, simulate
        >>> fed = federated_dataset("digits", num_clients=6, alpha=0.5)
        >>> model = make_model("mlp", fed.input_shape, fed.num_classes)
        >>> h = simulate(fed, model, SCAFFOLD(), rounds=2, clients_per_round=3, progress=False)
        >>> sorted(h.final_state)
        ['control']
    """

    name = "scaffold"
    # sums of Delta_i and Delta c_i; direction(..., weights=) (FedVG on SCAFFOLD)
    needs = Needs(signals={"delta_c", "num_steps"}, sums_only=True, weighted_direction=True)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """Server state ``params``, ``optimizer``, ``control`` (c = 0) and ``num_clients``; client state ``control``.

        Args:
            params: theta_0, ``{name: Tensor}``; the controls are zeros shaped like it.
            model: the architecture (unused here).
            num_clients: N, the rows of the client controls (and the 1/N of the server's update of c).
            seed: the run's seed (unused here).

        Returns:
            ``(server_state, {"control": {name: Tensor[N, ...]}})``, the server's ``control``
            ``{name: Tensor}`` and the clients' zero.
        """
        server, _ = super().init_state(params, model, num_clients, seed)
        control = {k: torch.zeros_like(v) for k, v in params.items()}
        server = SCAFFOLDState(**server, control=control, num_clients=int(num_clients))
        return server, {"control": _zeros_stacked(params, num_clients)}

    def client_view(self, server_state: Mapping) -> dict:
        """theta_t and c: what the clients read.

        Args:
            server_state: with ``params`` and ``control``.

        Returns:
            ``{"params": {name: Tensor}, "control": {name: Tensor}}``.
        """
        return {"params": server_state["params"], "control": server_state["control"]}

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """Train with ``linear = c - c_i``; return the new ``c_i`` rows and ``signals["delta_c"]``.

        Args:
            work: the round's clients.
            server_state: with ``params`` (x) and ``control`` (c).
            state: the selected rows ``{"control": {name: Tensor[m, ...]}}``.

        Returns:
            The :class:`ClientOutput` (signals ``delta_c`` and ``num_steps``).
        """
        params, c = server_state["params"], server_state["control"]
        c_i = state["control"]
        local = work.train(params, linear={k: c[k].unsqueeze(0) - c_i[k] for k in params})
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        # a client whose update is NaN/Inf gets a NaN row: the driver drops it (on_nonfinite)
        new_c_i = scaffold_control_update(c_i, c, deltas, local.num_steps, work.config.lr, finite=False)
        delta_c = {k: new_c_i[k] - c_i[k] for k in params}
        signals = {"delta_c": delta_c, "num_steps": local.num_steps}
        return ClientOutput(deltas, local.train_loss, signals, {"control": new_c_i})

    def direction(
        self, server_state: Mapping, updates: ClientUpdates, weights: Tensor | None = None
    ) -> tuple[Params, Mapping, dict]:
        """Server step: ``g = -mean_S Delta y_i`` (or ``-sum p_i Delta y_i`` with ``weights``); the new c.

        Args:
            server_state: with ``control`` (c) and ``num_clients`` (N).
            updates: the round's updates, with ``signals["delta_c"]`` from :meth:`client_update`.
            weights: optional ``Tensor[m]`` replacing the uniform mean (FedVG on SCAFFOLD).

        Returns:
            ``(g, server_state with the new control, diagnostics)``; diagnostics ``weights`` and
            ``control_norm`` (``||c||``).
        """
        _check_weights_arg(weights)
        if "delta_c" not in updates.signals:
            raise ValueError("SCAFFOLD needs updates.signals['delta_c'] (Delta c_i); its client_update reports it.")
        step, control = scaffold_server_update(
            updates.deltas,
            updates.signals["delta_c"],
            server_state["control"],
            server_state["num_clients"],
            weights,
            check=not updates.checked,
        )
        norm = torch.sqrt(sum((v.double() ** 2).sum() for v in control.values()))
        diag = {"weights": _used_weights(updates, weights), "control_norm": float(norm)}
        return {k: -v for k, v in step.items()}, updated(server_state, control=control), diag


@register
class FedDyn(Strategy):
    """FedDyn (Acar et al., ICLR 2021): dynamic regularisation of the clients' objective.

    Client k minimises ``L_k(theta) - <phi_k, theta> + (alpha/2) ||theta - theta^{t-1}||^2`` from
    ``theta^{t-1}`` and sets ``phi_k <- phi_k - alpha (theta_k^t - theta^{t-1})``
    (:func:`~fedlearn_edu.aggregators.feddyn_client_update`); the server sets
    ``h <- h - (alpha/N) sum_S Delta_k`` and ``theta^t = mean_S theta_k - h/alpha``
    (:func:`~fedlearn_edu.aggregators.feddyn_server_update`). ``phi_k`` and ``h`` start at zero.

    Args:
        alpha: the regularisation strength (> 0; the paper uses 1e-2 .. 1e-1).
        server_lr: eta_s; 1 is FedDyn (kept as a knob only for composition experiments).

    Client state: ``gradient`` (``{name: Tensor[N, ...]}``, the linear terms phi_k; the paper's
    ``grad L_k(theta_k^{t-1})``, equal to it only when the local problem is solved exactly).

    Example:
        >>> FedDyn(alpha=0.1).configure_local(LocalTraining()).prox_mu
        0.1
    """

    name = "feddyn"
    prox_argument = "alpha"  # the clients' prox_mu
    needs = Needs(sums_only=True, weighted_direction=True)  # the sum of the Delta_k; weights= (FedVG on FedDyn)

    def __init__(self, alpha: float = 0.01, server_lr: float = 1.0):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        self.alpha = check_positive(alpha, "FedDyn's alpha")

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """Server state ``params``, ``optimizer``, ``h`` (0) and ``num_clients``; client state ``gradient``.

        Args:
            params: theta_0, ``{name: Tensor}``; ``h`` and the ``phi_k`` are zeros shaped like it.
            model: the architecture (unused here).
            num_clients: N, the rows of ``gradient`` (and the 1/N of the server's update of h).
            seed: the run's seed (unused here).

        Returns:
            ``(server_state, {"gradient": {name: Tensor[N, ...]}})``, both zero.
        """
        server, _ = super().init_state(params, model, num_clients, seed)
        h = {k: torch.zeros_like(v) for k, v in params.items()}
        server = FedDynState(**server, h=h, num_clients=int(num_clients))
        return server, {"gradient": _zeros_stacked(params, num_clients)}

    def nonfinite_hint(self) -> str:
        """FedDyn's direction divides its state h by alpha: a tiny alpha (or a huge server_lr) overflows it."""
        return (
            f"FedDyn's direction divides its state h by alpha (now {self.alpha:g}), which overflows: use a "
            f"larger alpha (the paper uses 1e-2 to 1e-1), or a smaller server_lr (now {self.server_lr:g})."
        )

    def configure_local(self, config: LocalTraining) -> LocalTraining:
        """The clients' settings with ``prox_mu = alpha``.

        Args:
            config: the run's settings for the round (not modified).

        Returns:
            A copy of ``config`` with ``prox_mu = alpha``.
        """
        return config.replace(prox_mu=self.alpha)

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """Train with ``linear = -phi_k``; return ``phi_k - alpha Delta_k``.

        Args:
            work: the round's clients.
            server_state: with ``params`` (theta^{t-1}).
            state: the selected rows ``{"gradient": {name: Tensor[m, ...]}}``.

        Returns:
            The :class:`ClientOutput`.
        """
        params = server_state["params"]
        phi_k = state["gradient"]
        local = work.train(params, linear={k: -v for k, v in phi_k.items()})
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        new_phi = feddyn_client_update(phi_k, deltas, self.alpha, finite=False)  # NaN rows: the driver's
        return ClientOutput(deltas, local.train_loss, {}, {"gradient": new_phi})

    def direction(
        self, server_state: Mapping, updates: ClientUpdates, weights: Tensor | None = None
    ) -> tuple[Params, Mapping, dict]:
        """Server step: ``g = -(mean_S Delta_k - h+/alpha)``; the new h.

        Args:
            server_state: with ``h`` and ``num_clients``.
            updates: the round's updates.
            weights: optional ``Tensor[m]`` replacing the uniform mean (FedVG on FedDyn).

        Returns:
            ``(g, server_state with the new h, {"weights": ...})``.
        """
        _check_weights_arg(weights)
        step, h = feddyn_server_update(
            updates.deltas,
            server_state["h"],
            self.alpha,
            server_state["num_clients"],
            weights,
            check=not updates.checked,
        )
        g = {k: -v for k, v in step.items()}
        return g, updated(server_state, h=h), {"weights": _used_weights(updates, weights)}


@register
class FedNova(FedAvg):
    """FedNova (Wang et al., NeurIPS 2020): normalised averaging.

    ``g = -tau_eff sum_i p_i Delta_i / ||a_i||_1`` with ``p_i = n_i / sum_j n_j``,
    ``tau_eff = sum_i p_i ||a_i||_1`` and ``||a_i||_1`` the effective number of local steps
    (:func:`~fedlearn_edu.aggregators.fednova_norms`: ``tau_i`` for plain SGD, the paper's
    closed forms with the clients' momentum or FedProx term, read from the round's
    settings). Every client taking the same number of steps gives FedAvg.

    With a proximal term (``LocalTraining.prox_mu > 0``, e.g. FedNova on FedProx's clients)
    ``tau_eff`` follows the authors' code (``distoptim/FedNova.py``): ``sum_i p_i tau_i``, the
    step counts, unless ``prox_tau_eff="norms"`` (``sum_i p_i ||a_i||_1``, a shorter step;
    :func:`~fedlearn_edu.aggregators.fednova_tau_eff`). Without one the two agree.

    Args:
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        prox_tau_eff: ``"steps"`` (default, the authors' code) or ``"norms"``.

    Diagnostics: ``weights`` (``p_i``), ``tau`` (``Tensor[m]``) and ``tau_eff``.
    """

    name = "fednova"
    needs = Needs(signals={"num_steps"}, sums_only=True)  # sum p_i tau_i, sum p_i Delta_i / tau_i

    def __init__(
        self, server_lr: float | None = None, optimizer: ServerOptimizer | None = None, prox_tau_eff: str = "steps"
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer)
        if prox_tau_eff not in PROX_TAU_EFF:
            raise ValueError(f"prox_tau_eff must be one of {PROX_TAU_EFF}, got {prox_tau_eff!r}.")
        self.prox_tau_eff = prox_tau_eff

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """FedAvg's client update plus ``signals["num_steps"]`` (``Tensor[m]``).

        Args:
            work: the round's clients.
            server_state: with ``params`` (theta_t, ``{name: Tensor}``).
            state: unused (FedNova keeps no client state).

        Returns:
            The :class:`ClientOutput`: ``deltas`` ``{name: Tensor[m, ...]}``, ``train_loss``
            ``Tensor[m]`` and ``signals["num_steps"]``, the local step counts ``Tensor[m]``.
        """
        params = server_state["params"]
        local = work.train(params)
        deltas = {k: local.params[k] - params[k].unsqueeze(0) for k in params}
        return ClientOutput(deltas, local.train_loss, {"num_steps": local.num_steps})

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -tau_eff sum_i p_i Delta_i / ||a_i||_1``; the state unchanged.

        Args:
            server_state: the server state.
            updates: the round's updates, with ``signals["num_steps"]``.

        Returns:
            ``(g, server_state, diagnostics)``.
        """
        tau = _local_steps(updates, "FedNova")
        cfg = updates.config or LocalTraining()
        proximal = cfg.lr * cfg.prox_mu
        step = fednova_aggregate(
            updates.deltas,
            tau,
            updates.num_samples,
            cfg.momentum,
            proximal,
            self.prox_tau_eff,
            check=not updates.checked,
        )
        tau_eff = float(fednova_tau_eff(tau.cpu(), updates.num_samples, cfg.momentum, proximal, self.prox_tau_eff))
        diag = {"weights": updates.size_weights, "tau": tau.cpu(), "tau_eff": tau_eff}
        return {k: -v for k, v in step.items()}, server_state, diag

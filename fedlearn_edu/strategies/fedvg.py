"""FedVG: weigh clients by how flat the validation loss is at their models.

Server side, each round (Devkota et al., 2026)::

    theta_k = theta_t + Delta_k                                  (rebuilt from the deltas)
    g_{k,l} = batch-averaged validation gradient at theta_k      (signals.validation_gradient_norms)
    s_k     = (1/(G_k + eps)) / sum_j 1/(G_j + eps),  G_k = sum_l ||g_{k,l}||_p
    theta_{t+1} = theta_t + eta_s * sum_k s_k Delta_k

FedVG is a *weighting module*: its direction is ``g = -sum_k s_k Delta_k``, so it
composes with what clients do and with how the server applies ``g``:

* FedVG on top of **any base strategy** (``FedVG(val, base=FedProx(mu))``): the clients
  run the base's local objective and client update (e.g. FedProx's
  ``(mu/2)||w - theta_t||^2``), and the base's server optimizer applies FedVG's
  direction (e.g. ``FedAvgM``'s momentum, ``FedAdam``'s moments);
* FedVG on **SCAFFOLD** or **FedDyn** (``FedVG(val, base=SCAFFOLD())``): the base's
  server step (control variates, FedDyn's state h) runs with FedVG's weights in place of
  its uniform mean (bases whose ``direction`` takes ``weights=``, ``needs.weighted_direction``);
* FedVG with **any server optimizer** (``optimizer=ServerMomentum(eta_s, beta)``, or the
  shorthand ``server_momentum=beta``).

:meth:`FedVG.on_top_of` is ``FedVG(val, base=base)``. FedVG is a
:class:`~fedlearn_edu.strategies.wrapper.Wrapper` that overrides the direction (and the clients'
``prox_mu`` when given): with a base, its server state is ``{"base": the base's server state}``
(its ``"optimizer"`` entry is FedVG's optimizer's) and every other hook is the base's; without
one, FedAvg's clients and a flat server state. A base without one global model (IFCA,
local-only, Gossip, DAC), a personalised one (Ditto), a private one (DP-FedAvg) or another
FedVG is refused at construction.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from ..aggregators import fedvg_aggregate, fedvg_layerwise_weights, fedvg_mixed_weights, fedvg_weights
from ..checks import check_bool, check_int, check_norm_order, check_positive, check_range
from ..engine import LocalTraining, make_engine
from ..params import Params
from ..signals import as_validation_set, validation_gradient_norms
from .base import ClientUpdates, Needs, Strategy, check_base
from .registry import register
from .server_optim import ServerMomentum, ServerOptimizer, ServerSGD, momentum
from .wrapper import Wrapper

__all__ = ["FedVG"]

MODES = ("clientwise", "layerwise")


@register
class FedVG(Wrapper):
    """FedVG (Devkota et al., 2026): validation-gradient weighting.

    Args:
        val_data: the server's validation set, ``(x: Tensor[n, ...], y: Tensor[n])`` or a
            ``TensorDataset`` (e.g. from :func:`fedlearn_edu.data.server_validation_split`
            or :func:`fedlearn_edu.data.external_validation_set`).
        norm_order: p of the per-tensor gradient norm (1 in the authors' code; 2 also used).
        mode: ``"clientwise"`` (one weight per client, from ``G_k = sum_l ||g_{k,l}||``) or
            ``"layerwise"`` (one weight vector per parameter tensor,
            ``s_{k,l} ∝ 1/(||g_{k,l}|| + eps)``).
        mix: use ``(s_k + n_k / sum_j n_j) / 2`` (the authors' mixed weight).
        eps: added before inverting the norms (1e-8).
        server_lr: eta_s (``None``: 1.0); not with ``optimizer`` or ``base``, which carry the step.
        server_momentum: beta of FedAvgM-style server momentum on the FedVG-weighted
            pseudo-gradient (0: plain FedVG); a shorthand for
            ``optimizer=ServerMomentum(server_lr, beta)``.
        prox_mu: FedProx proximal coefficient of the clients' local loss (0: FedAvg clients).
        batch_size: batch size of the validation-gradient definition (32).
        engine: the engine of the validation gradients: ``"vmap"`` (all clients in one batched
            pass), ``"loop"`` or an engine object (:func:`fedlearn_edu.engine.make_engine`).
        base: a strategy whose clients (``configure_local``, ``client_update``), server state
            and server optimizer FedVG keeps (its direction is replaced by FedVG's).
        optimizer: the server optimizer (default: ``base``'s, else
            ``ServerSGD(server_lr)`` or ``ServerMomentum(server_lr, server_momentum)``).

    Diagnostics per round: ``weights`` (``Tensor[m]``; for the layer-wise mode the mean of the
    per-tensor weights), ``grad_norm`` (``G_k``, ``Tensor[m]``), ``grad_norms``
    (``Tensor[m, L]``) and, layer-wise, ``layer_weights`` (``Tensor[m, L]``).

    Example:
        >>> from fedlearn_edu import federated_dataset, make_model, simulate
        >>> from fedlearn_edu.data import server_validation_split
        >>> fed = federated_dataset("digits", num_clients=10, alpha=0.5)
        >>> fed, val = server_validation_split(fed, fraction=0.1)
        >>> model = make_model("mlp", fed.input_shape, fed.num_classes)
        >>> h = simulate(fed, model, FedVG(val), rounds=2, clients_per_round=5, progress=False)
        >>> h.diagnostics[0]["weights"].shape
        torch.Size([5])
    """

    name = "fedvg"
    wraps = frozenset({"client", "server"})  # the clients' prox_mu; its own weighting of the updates

    def __init__(
        self,
        val_data,
        norm_order: float = 1,
        mode: str = "clientwise",
        mix: bool = False,
        eps: float = 1e-8,
        server_lr: float | None = None,
        server_momentum: float = 0.0,
        prox_mu: float = 0.0,
        batch_size: int = 32,
        engine="vmap",
        base: Strategy | None = None,
        optimizer: ServerOptimizer | None = None,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        if base is not None:
            check_base("FedVG", base)
            if isinstance(base, FedVG):
                raise ValueError(
                    "FedVG over FedVG cannot work: the outer FedVG's weights replace the inner one's. "
                    "Use one FedVG (on the inner one's base)."
                )
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
        norm_order = check_norm_order(norm_order)
        eps = check_positive(eps, "eps")
        server_momentum = check_range(server_momentum, "server_momentum", 0, 1, high_open=True)
        prox_mu = check_positive(prox_mu, "prox_mu", allow_zero=True)
        mix = check_bool(mix, "mix")
        batch_size = check_int(batch_size, "batch_size", 1)
        if optimizer is not None and (server_lr is not None or server_momentum):
            given = "server_lr" if server_lr is not None else "server_momentum"
            raise ValueError(
                f"{given}={server_lr if server_lr is not None else server_momentum!r} beside optimizer={optimizer!r}: "
                "the optimizer carries the server's step, and would silently win. Give the step inside the "
                "optimizer (e.g. optimizer=ServerMomentum(0.5, 0.9)) and drop server_lr and server_momentum."
            )
        if base is not None and server_lr is not None:
            raise ValueError(
                f"server_lr={server_lr!r} with base={type(base).__name__}: FedVG steps with its base's optimizer, "
                f"which would silently win. Set the step on the base (e.g. base={type(base).__name__}(server_lr=...)) "
                "or pass optimizer=."
            )
        if optimizer is None:
            server_lr = 1.0 if server_lr is None else server_lr
            if base is not None and server_momentum == 0:
                optimizer = base.optimizer  # stateless: its moments live in the server state
            elif server_momentum:
                lr = check_positive(server_lr, "server_lr") if base is None else base.server_lr
                optimizer = ServerMomentum(lr, server_momentum)
            else:
                optimizer = ServerSGD(check_positive(server_lr, "server_lr"))
        super().__init__(base, optimizer=optimizer)
        self._engine = make_engine(engine)
        self._val = as_validation_set(val_data)
        self.num_val = int(self._val[1].shape[0])
        self.norm_order = float(norm_order)
        self.mode = mode
        self.mix = bool(mix)
        self.eps = float(eps)
        self._prox_mu = float(prox_mu)
        self.batch_size = int(batch_size)
        self.engine = getattr(self._engine, "name", type(self._engine).__name__)
        if self._base_takes_weights and mode != "clientwise":
            raise ValueError(
                f"FedVG on {type(base).__name__} replaces its uniform mean by one weight per client: "
                "use mode='clientwise'."
            )

    @classmethod
    def on_top_of(cls, base: Strategy, val_data, **kwargs) -> FedVG:
        """FedVG with the clients and the server optimizer of ``base``: ``FedVG(val_data, base=base)``.

        ``FedProx(mu)`` gives FedProx's clients; ``FedAvgM(server_lr, momentum)`` its momentum;
        ``FedAdam()`` its adaptive server step. Other keyword arguments go to :class:`FedVG`.

        Args:
            base: the base strategy (one global model, not personalised: see :func:`check_base`).
            val_data: the server's validation set ``(x: Tensor[n, ...], y: Tensor[n])``.
            **kwargs: FedVG's other arguments (``norm_order``, ``mode``, ``optimizer``, ...).

        Returns:
            The :class:`FedVG`.

        Example:
            >>> import torch
            >>> from fedlearn_edu import FedProx
            >>> x, y = torch.rand(8, 4), torch.arange(8) % 2
            >>> FedVG.on_top_of(FedProx(mu=0.1), (x, y)).prox_mu
            0.1
        """
        return cls(val_data, base=base, **kwargs)

    @property
    def prox_mu(self) -> float:
        """The proximal coefficient of the clients' objective (the base's, if any)."""
        return self.configure_local(LocalTraining()).prox_mu

    @property
    def server_momentum(self) -> float:
        """The server optimizer's momentum beta (0 unless it is, or chains, a momentum piece)."""
        return next((float(t.beta) for t in self.optimizer.pieces() if isinstance(t, momentum)), 0.0)

    @property
    def needs(self) -> Needs:
        """A validation set, plus the base's client signals."""
        signals = frozenset() if self.base is None else self.base.needs.signals
        return Needs(signals=signals, validation=True)

    def configure_local(self, config: LocalTraining) -> LocalTraining:
        """The base's client settings, then FedVG's ``prox_mu`` if set.

        Args:
            config: the run's settings for the round (not modified).

        Returns:
            The base's settings (``config`` without a base), with ``prox_mu`` replaced when
            FedVG's own ``prox_mu`` is non-zero.
        """
        config = super().configure_local(config)
        return config.replace(prox_mu=self._prox_mu) if self._prox_mu else config

    @property
    def validation_data(self) -> tuple[Tensor, Tensor]:
        """The server's validation set ``(x: Tensor[n, ...], y: Tensor[n])`` (checked by ``simulate`` up front)."""
        return self._val

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -sum_k s_k Delta_k`` with FedVG's weights (through the base's step for SCAFFOLD/FedDyn).

        Args:
            server_state: FedVG's server state (``{"base": ...}`` with a base).
            updates: the round's updates.

        Returns:
            ``(g, server_state, diagnostics)``: with a weighted base (SCAFFOLD, FedDyn), its own
            entries (control variates, h) updated under ``"base"``.
        """
        params = self.server_params(server_state)
        device = next(iter(params.values())).device
        # The server rebuilds the clients' models from their deltas: theta_k = theta_t + Delta_k.
        theta = {k: params[k].unsqueeze(0) + updates.deltas[k] for k in params}
        val = tuple(t.to(device) for t in self._val)
        norms = validation_gradient_norms(
            updates.model,
            theta,
            val,
            self.norm_order,
            batch_size=self.batch_size,
            engine=self._engine,
        )
        if self.mode == "clientwise":
            weights = fedvg_weights(norms, self.eps)
        else:
            weights = fedvg_layerwise_weights(norms, self.eps)
        if self.mix:
            weights = fedvg_mixed_weights(weights, updates.num_samples)
        diag = {
            "weights": weights if weights.dim() == 1 else weights.mean(dim=1),
            "grad_norm": norms.sum(dim=1),
            "grad_norms": norms,
        }
        if weights.dim() == 2:
            diag["layer_weights"] = weights
        if self._base_takes_weights:
            # SCAFFOLD / FedDyn: their server step (control variates, state h) with FedVG's
            # weights in place of the uniform mean.
            g, base, base_diag = self.base.direction(self.base_state(server_state), updates, weights=weights)
            return g, self.with_base_state(server_state, base), {**base_diag, **diag}
        step = fedvg_aggregate(updates.deltas, weights, check=not updates.checked)
        return {k: -v for k, v in step.items()}, server_state, diag

    @property
    def _base_takes_weights(self) -> bool:
        return self.base is not None and self.base.needs.weighted_direction

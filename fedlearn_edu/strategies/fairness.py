"""Fairness baselines as strategies: AFL (minimax over client mixtures) and FedLF (layer-wise MGDA).

Both read the clients' losses ``F_k(theta_t)`` (the received model's loss on their
training data, reported with the updates as ``signals["global_loss"]``, as for q-FedAvg
and FedFV) and call the pure math of :mod:`fedlearn_edu.aggregators.afl` and
:mod:`fedlearn_edu.aggregators.fedlf`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..aggregators import afl_direction, afl_lambda_step, fedlf_direction
from ..checks import check_bool, check_positive
from ..params import Params
from .base import ClientUpdates, Needs
from .conflict import GlobalLossSignal
from .craft import craft_layer_groups
from .registry import register
from .server_optim import ServerOptimizer
from .state import AFLState, updated

__all__ = ["AFL", "FedLF"]


def _losses(updates: ClientUpdates, who: str):
    """``Tensor[m]``: ``signals["global_loss"]``, or a clear error."""
    if "global_loss" not in updates.signals:
        raise ValueError(f"{who} needs updates.signals['global_loss'] (F_k(theta_t)); client_signals computes it.")
    return updates.signals["global_loss"]


AFL_ITERATES = ("last", "average")


@register
class AFL(GlobalLossSignal):
    """Agnostic federated learning (Mohri, Sivek & Suresh, ICML 2019), Stochastic-AFL.

    The server keeps mixture weights ``lambda`` on the simplex over the N clients (uniform at
    the start). Each round, with the selected clients S and their losses ``L_k = F_k(theta_t)``:

    * model step: ``theta <- theta + eta_s (N/m) sum_{k in S} lambda_k Delta_k``
      (:func:`~fedlearn_edu.aggregators.afl_direction`), i.e. ``g = -(N/m) sum lambda_k Delta_k``;
    * weight step: ``lambda <- Proj_simplex(lambda + gamma_lambda (N/m) L_S)``
      (:func:`~fedlearn_edu.aggregators.afl_lambda_step`).

    Both steps use the lambda of the start of the round, as in Algorithm 1. Our choice: the
    clients send their local *updates* (several SGD steps, as every strategy here) where the
    paper's clients send one stochastic gradient.

    **Which model is evaluated.** Algorithm 1 outputs the *averaged* iterate
    ``theta^A_T = (1/T) sum_{t=1}^T theta_t`` (the models after each of the T server steps,
    not ``theta_0``), and the fairness baselines' code (gfedplat's ``AFL.result_module``,
    github.com/zibinpan/FedLF) tests that average. ``iterate="last"`` (default) evaluates
    the last iterate ``theta_T``, as every other strategy; ``iterate="average"`` makes the
    running average ``theta^A`` the model ``History.client_accuracy`` is of (``theta_0``
    before the first round), with the last iterate in ``History.other_accuracy["last"]``.
    Training is the same either way: the clients always receive ``theta_t``, and
    ``History.final_params`` is ``theta_T``; the server state's ``average`` holds ``theta^A``.

    **A dropped client** (``simulate(..., on_nonfinite="skip")``, a client whose update is NaN)
    counts as not selected that round: both steps run over the m' surviving clients with
    ``N/m'``, and the dropped client's ``lambda_k`` takes no ascent step. The survivors' steps
    are therefore ``m/m'`` larger than they would have been with the bad client present -- the
    unbiased Stochastic-AFL estimate over the clients actually heard from (``N`` enters the
    update, so no choice leaves the other clients' steps as they were).

    Args:
        lambda_lr: gamma_lambda (> 0), the ascent step on the mixture weights.
        server_lr: eta_s.
        iterate: ``"last"`` (default) or ``"average"``, the model the History evaluates.

    Server state: FedAvg's plus ``lambdas`` (``Tensor[N]``, float64), ``average`` (``theta^A``,
    ``None`` before the first step; kept only with ``iterate="average"``) and ``num_averaged`` (T).
    Diagnostics: ``lambdas`` (``Tensor[N]``, after the round's step) and ``losses``.
    """

    name = "afl"

    def __init__(self, lambda_lr: float = 0.1, server_lr: float = 1.0, iterate: str = "last"):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        lambda_lr = check_positive(lambda_lr, "lambda_lr")
        if iterate not in AFL_ITERATES:
            raise ValueError(f"iterate must be one of {AFL_ITERATES}, got {iterate!r}.")
        self.lambda_lr = float(lambda_lr)
        self.iterate = iterate
        self.evaluates = "global" if iterate == "last" else "average"

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """FedAvg's server state plus uniform ``lambdas``, ``average = None``, ``num_averaged = 0``.

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device.
            model: the architecture (unused here).
            num_clients: N; ``lambdas`` is ``Tensor[N]`` (float64), each ``1/N``.
            seed: the run's seed (unused here).

        Returns:
            ``(server_state, {})``.
        """
        server, clients = super().init_state(params, model, num_clients, seed)
        lambdas = torch.full((int(num_clients),), 1.0 / num_clients, dtype=torch.float64)
        return AFLState(**server, lambdas=lambdas, average=None, num_averaged=0), clients

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -(N/m) sum lambda_k Delta_k`` and the ascent step on ``lambdas`` (both from the round's start).

        Args:
            server_state: with ``lambdas``.
            updates: the round's updates, with ``signals["global_loss"]``.

        Returns:
            ``(g, server_state with the new lambdas, {"lambdas", "losses"})``.
        """
        losses = _losses(updates, "AFL")
        ids = updates.client_ids.cpu()
        lambdas = server_state["lambdas"].cpu()  # the mixture weights are kept on the CPU
        step = afl_direction(updates.deltas, lambdas, ids, check=not updates.checked)
        lambdas = afl_lambda_step(lambdas, losses.detach().double().cpu(), self.lambda_lr, ids)
        diag = {"lambdas": lambdas.clone(), "losses": losses}
        return {k: -v for k, v in step.items()}, updated(server_state, lambdas=lambdas), diag

    def step(self, server_state: Mapping, g: Params, optimizer: ServerOptimizer | None = None) -> Mapping:
        """The optimizer's step, then (``iterate="average"``) the running average ``theta^A``; pure.

        Args:
            server_state: the state :meth:`direction` returned (not modified), with ``average``
                (``{name: Tensor}`` or ``None``) and ``num_averaged`` (T).
            g: the direction, shaped like theta_t.
            optimizer: the optimizer that steps (default ``self.optimizer``; a wrapper passes its own).

        Returns:
            The server state at t + 1; with ``iterate="average"`` its ``average`` includes
            theta_{t+1} and ``num_averaged`` is T + 1.
        """
        server_state = super().step(server_state, g, optimizer)
        if self.iterate == "average":  # theta^A_T = ((T - 1) theta^A_{T-1} + theta_T) / T
            new, average, t = server_state["params"], server_state["average"], server_state["num_averaged"]
            if average is None:
                average = {k: v.detach().clone() for k, v in new.items()}
            else:
                average = {k: (t * average[k] + new[k].detach()) / (t + 1) for k in new}
            server_state = updated(server_state, average=average, num_averaged=t + 1)
        return server_state

    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """theta_t (``iterate="last"``), or ``{"average": theta^A, "last": theta_t}``.

        Args:
            model: the architecture (unused here).
            server_state: with ``params`` and ``average`` (``None`` before the first step:
                theta_t stands in for it).
            state: the client state (unused, empty).
            train_sets: the clients' training sets (unused).

        Returns:
            ``{"global": (theta_t, None)}``, or ``{"average": (theta^A, None), "last": (theta_t, None)}``.
        """
        if self.iterate == "last":
            return super().eval_models(model, server_state, state, train_sets)
        params, average = server_state["params"], server_state["average"]
        return {"average": (params if average is None else average, None), "last": (params, None)}


FEDLF_GROUPS = ("tensor", "module")


@register
class FedLF(GlobalLossSignal):
    """FedLF (Pan et al., AAAI 2024): layer-wise fair aggregation.

    Per layer group, the minimum-norm point of the convex hull of the clients' layer
    pseudo-gradients rescaled to their mean length, plus FedLF's fairness row built from the
    clients' losses; the whole direction is rescaled to ``||mean_i g_i||``
    (:func:`~fedlearn_edu.aggregators.fedlf_direction`). ``theta <- theta - eta_s d``.

    The layer groups: ``groups="tensor"`` (default) solves one problem per parameter
    *tensor* (a module's weight and its bias separately), as the authors' code does
    (``gfedplat/algorithm/FedLF/FedLF.py`` in github.com/zibinpan/FedLF loops over
    ``Module.Loc_list``, one index range per ``model.parameters()`` entry);
    ``groups="module"`` one per module, weight and bias together (CRAFT's groups,
    :func:`craft_layer_groups`; its direction is not the authors': 7.7 % apart in relative norm
    in the first round of chapter 2's digits MLP). ``layerwise=False`` solves one problem for
    the whole model.

    Differences from the authors' code that remain: the clients send their local *updates*
    (``g_i = -Delta_i``, several SGD steps) where gfedplat's FedLF sends one full gradient;
    the authors' rows of recently-seen absent clients are not added; a rescaled direction
    that conflicts with a client by rounding is replaced by the unscaled one (the authors
    first halve it while it stays above twice the unscaled length).

    Args:
        server_lr: eta_s.
        fairness: add the loss-based fairness row (``False``: plain layer-wise MGDA).
        layerwise: one problem per layer group (``False``: one for the whole model).
        groups: ``"tensor"`` (default, the authors') or ``"module"``.

    Diagnostics: ``losses``.
    """

    name = "fedlf"

    def __init__(self, server_lr: float = 1.0, fairness: bool = True, layerwise: bool = True, groups: str = "tensor"):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        if groups not in FEDLF_GROUPS:
            raise ValueError(f"groups must be one of {FEDLF_GROUPS}, got {groups!r}.")
        self.fairness = check_bool(fairness, "fairness")
        self.layerwise = check_bool(layerwise, "layerwise")
        self.groups = groups

    @property
    def needs(self) -> Needs:
        """``global_loss`` signals with the fairness row, none without."""
        return Needs(signals={"global_loss"}) if self.fairness else Needs()

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """FedLF's layer-wise fair direction; the state unchanged; diagnostics ``losses``.

        Args:
            server_state: with ``params`` (``{name: Tensor}``; its names form the one group
                with ``layerwise=False``); returned as given.
            updates: the round's updates: ``deltas`` ``{name: Tensor[m, ...]}``, with
                ``fairness=True`` ``signals["global_loss"]`` ``Tensor[m]``, and ``model`` for
                ``groups="module"``.

        Returns:
            ``(d, server_state, diagnostics)``: ``d`` ``{name: Tensor}`` shaped like theta_t;
            ``{"losses": Tensor[m]}`` with the fairness row, else ``{}``.

        Raises:
            ValueError: ``fairness=True`` and ``updates.signals`` has no ``"global_loss"``.
        """
        params = server_state["params"]
        losses = _losses(updates, "FedLF") if self.fairness else None
        if not self.layerwise:
            groups = {"model": list(params)}
        elif self.groups == "module" and updates.model is not None:
            groups = craft_layer_groups(updates.model)
        else:
            groups = None  # one problem per parameter tensor
        pseudo = {k: -v for k, v in updates.deltas.items()}
        d = fedlf_direction(pseudo, None if losses is None else losses.detach(), groups=groups)
        return d, server_state, ({} if losses is None else {"losses": losses})

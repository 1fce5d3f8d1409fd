"""Personalised and clustered baselines as one-line calls: local-only, IFCA and Ditto.

Each is a strategy (:mod:`fedlearn_edu.strategies.personalized`) run by
:func:`~fedlearn_edu.simulate`, the one round driver: same seeded client sampling,
same per-client batch orders, same engines, NaN checks and checkpoints. These
functions keep the calls the chapters use and return a :class:`PersonalizedHistory`,
a :class:`~fedlearn_edu.History` whose ``client_accuracy[e, i]`` is the accuracy of
the model *client i would use* (its own, its cluster's, or its personal model) on
client i's local test split, so the numbers sit in one table with FedAvg's.

======================  ==========================================================
:func:`simulate_local`  ``simulate(..., LocalOnly())``
:func:`simulate_ifca`   ``simulate(..., IFCA(num_clusters, warmup_rounds))``
:func:`simulate_ditto`  ``simulate(..., Ditto(lam, global_strategy, personal_epochs))``
======================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor, nn

from .data.federation import ClientData, Federation
from .engine import LocalResult, LocalTraining, LoopEngine, VmapEngine, make_engine
from .params import Params
from .simulation import History, evaluate_clients, simulate
from .strategies.base import Strategy
from .strategies.personalized import IFCA, Ditto, LocalOnly, client_losses

__all__ = [
    "PersonalizedHistory",
    "train_clients",
    "evaluate_personal",
    "client_losses",
    "ditto_personal_update",
    "simulate_local",
    "simulate_ifca",
    "simulate_ditto",
]


@dataclass
class PersonalizedHistory(History):
    """A :class:`~fedlearn_edu.History` for methods with several models.

    ``client_accuracy[e, i]`` / ``client_loss[e, i]``: the model client i uses at evaluation e
    (local: its own; IFCA: the cluster model with the lowest training loss on its data;
    Ditto: its personal model) on client i's local test split.

    Attributes:
        personal_params: ``{name: Tensor[N, ...]}`` the final model of every client
            (local-only and Ditto; for IFCA the cluster model each client picked).
        cluster_params: IFCA only: ``{name: Tensor[K, ...]}`` the final cluster models.
        assignments: IFCA only: ``ndarray[E, N]`` the cluster every client picked at each
            evaluation.
        global_client_accuracy: Ditto only: ``ndarray[E, N]`` accuracy of the *global* model.
    """

    personal_params: Params | None = None
    cluster_params: Params | None = None
    assignments: np.ndarray | None = None
    global_client_accuracy: np.ndarray | None = None

    @classmethod
    def of(cls, history: History) -> PersonalizedHistory:
        """The personalised view of a :func:`simulate` History."""
        out = cls(**{f.name: getattr(history, f.name) for f in fields(History)})
        out.personal_params = history.final_state.get("personal")
        out.global_client_accuracy = history.other_accuracy.get("global")
        return out


def train_clients(
    model: nn.Module,
    start: Params,
    datasets: Sequence[tuple[Tensor, Tensor]],
    config: LocalTraining,
    seeds: Sequence[int],
    *,
    anchor: Params | None = None,
    engine="auto",
) -> LocalResult:
    """Local SGD for m clients, client j starting from its own ``start[k][j]``.

    The engines' ``train(..., start=start)`` with ``anchor`` as the proximal centre: with all
    rows of ``start`` equal to ``anchor`` the result equals
    ``make_engine(engine).train(model, anchor, datasets, config, seeds)``.

    Args:
        model: the architecture (used through ``functional_call``).
        start: stacked starting parameters ``{name: Tensor[m, ...]}``.
        datasets: per client ``(x, y)`` on the model's device.
        config: local hyper-parameters; ``config.prox_mu > 0`` adds
            ``(prox_mu / 2) ||w - anchor||^2`` to the loss (Ditto's personal objective).
        seeds: per-client batch-order seeds.
        anchor: the proximal centre ``{name: Tensor}`` (one for all clients), needed when
            ``config.prox_mu > 0``.
        engine: ``"auto"``, ``"loop"`` or ``"vmap"`` (or an instance of those engines).

    Returns:
        :class:`~fedlearn_edu.engine.LocalResult` with the stacked trained parameters.
    """
    if config.prox_mu and anchor is None:
        raise ValueError("config.prox_mu > 0 needs an anchor (the proximal centre).")
    if anchor is None:  # no proximal term: the centre is never used
        anchor = {k: torch.zeros_like(v[0]) for k, v in start.items()}
    runner = make_engine(engine, model)
    if not isinstance(runner, (LoopEngine, VmapEngine)):
        raise TypeError(
            "train_clients supports the package engines ('auto', 'loop', 'vmap' or their "
            f"instances); got {type(runner).__name__}."
        )
    return runner.train(model, {k: v.detach() for k, v in anchor.items()}, datasets, config, seeds, start=start)


def evaluate_personal(
    model: nn.Module, params: Params, federation: Federation, split: str = "test"
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean loss of client i's own model ``{k: params[k][i]}`` on client i's data.

    :func:`~fedlearn_edu.evaluate_clients` with ``which = arange(N)``.

    Args:
        params: stacked ``{name: Tensor[N, ...]}``, one model per client.
        split: ``"test"`` (local test split, the default) or ``"train"``.

    Returns:
        ``(accuracy: ndarray[N], loss: ndarray[N])``; NaN for a client without samples.
    """
    n = len(federation)
    if any(v.shape[0] != n for v in params.values()):
        raise ValueError(f"params must hold one model per client (N = {n}) on the leading axis.")
    if split not in ("test", "train"):
        raise ValueError(f"split must be 'test' or 'train', got {split!r}.")
    if split == "train":
        federation = _train_as_test(federation)
    device = next(iter(params.values())).device
    return evaluate_clients(model, params, federation, which=torch.arange(n, device=device))


def _train_as_test(federation: Federation) -> Federation:
    clients = [ClientData(c.train_x, c.train_y, c.train_x, c.train_y, c.info) for c in federation]
    return Federation(clients, federation.num_classes, federation.name)


def ditto_personal_update(
    model: nn.Module,
    personal: Params,
    global_params: Params,
    datasets: Sequence[tuple[Tensor, Tensor]],
    config: LocalTraining,
    lam: float,
    seeds: Sequence[int],
    *,
    engine="auto",
) -> LocalResult:
    """Ditto's personal step for m clients: local SGD on ``F_i(v) + (lam / 2) ||v - theta_t||^2``.

    One step on a batch b is

        v <- v - lr * ( grad F_i(v; b) + lam * (v - theta_t) )

    (plus the configured momentum / weight decay, as for any local training), starting from
    each client's current personal model ``personal[k][i]``; ``theta_t`` is the global model
    the client received this round. This is what :class:`~fedlearn_edu.strategies.Ditto` runs.

    Args:
        personal: stacked ``{name: Tensor[m, ...]}``, the selected clients' personal models v_i.
        global_params: theta_t.
        lam: Ditto's lambda >= 0 (``lam = 0``: local training; large: the global model).
        model, datasets, config, seeds, engine: as in :func:`train_clients`.
    """
    if not (lam >= 0 and lam < float("inf")):
        raise ValueError(f"Ditto's lam must be a finite number >= 0, got {lam}.")
    return train_clients(
        model, personal, datasets, config.replace(prox_mu=float(lam)), seeds, anchor=global_params, engine=engine
    )


def simulate_local(federation: Federation, model: nn.Module, **kwargs) -> PersonalizedHistory:
    """Local-only training: ``simulate(federation, model, LocalOnly(), **kwargs)``.

    Every client starts from theta_0 and trains only on its own data whenever it is selected;
    nothing is averaged. Keyword arguments are those of :func:`~fedlearn_edu.simulate`.

    Example:
        >>> from fedlearn_edu import federated_dataset, make_model
        >>> fed = federated_dataset("digits", num_clients=4, alpha=1.0)
        >>> h = simulate_local(fed, make_model("mlp", fed.input_shape, 10), rounds=1, progress=False)
        >>> h.client_accuracy.shape
        (2, 4)
    """
    return PersonalizedHistory.of(simulate(federation, model, LocalOnly(), **kwargs))


def simulate_ifca(
    federation: Federation, model: nn.Module, num_clusters: int, *, warmup_rounds: int = 0, **kwargs
) -> PersonalizedHistory:
    """IFCA: ``simulate(federation, model, IFCA(num_clusters, warmup_rounds), **kwargs)``.

    See :class:`~fedlearn_edu.strategies.IFCA`. Keyword arguments are those of
    :func:`~fedlearn_edu.simulate`.

    Returns:
        :class:`PersonalizedHistory` with ``assignments`` (``ndarray[E, N]``),
        ``cluster_params`` and ``personal_params`` (the cluster model each client picked
        last); ``final_params`` is cluster 1; ``diagnostics[t]["assignment"]`` holds the
        selected clients' picks.
    """
    h = PersonalizedHistory.of(simulate(federation, model, IFCA(num_clusters, warmup_rounds), **kwargs))
    h.config.update(num_clusters=int(num_clusters), warmup_rounds=int(warmup_rounds))
    h.assignments = h.model_index
    h.cluster_params = h.final_params
    last = torch.as_tensor(h.assignments[-1])
    h.personal_params = {n: v[last] for n, v in h.cluster_params.items()}
    h.final_params = {n: v[0] for n, v in h.cluster_params.items()}
    return h


def simulate_ditto(
    federation: Federation,
    model: nn.Module,
    lam: float = 0.1,
    global_strategy: Strategy | None = None,
    *,
    personal_epochs: int | None = None,
    **kwargs,
) -> PersonalizedHistory:
    """Ditto: ``simulate(federation, model, Ditto(lam, global_strategy, personal_epochs), **kwargs)``.

    See :class:`~fedlearn_edu.strategies.Ditto`; ``global_strategy`` (FedAvg by default) is
    any :class:`~fedlearn_edu.Strategy`: "Ditto + CRAFT" is ``global_strategy=CRAFT()``.
    Keyword arguments are those of :func:`~fedlearn_edu.simulate`.

    Returns:
        :class:`PersonalizedHistory`: ``client_accuracy`` of the personal models,
        ``global_client_accuracy`` of the global model, ``final_params`` the global model,
        ``personal_params`` the personal ones; ``diagnostics`` as in ``simulate``
        (the global strategy's own, plus ``conflicts`` with ``diagnostics=("conflicts",)``).
    """
    return PersonalizedHistory.of(simulate(federation, model, Ditto(lam, global_strategy, personal_epochs), **kwargs))

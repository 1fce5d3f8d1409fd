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

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from .data.federation import Federation
from .params import Params
from .simulation import History, simulate
from .strategies.base import Strategy
from .strategies.personalized import IFCA, Ditto, LocalOnly, client_losses

__all__ = [
    "PersonalizedHistory",
    "client_losses",
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
        """The personalised view of a :func:`simulate` History.

        Args:
            history: a :class:`~fedlearn_edu.History` of a personalised strategy.

        Returns:
            A :class:`PersonalizedHistory` sharing ``history``'s arrays.
        """
        out = cls(**{f.name: getattr(history, f.name) for f in fields(History)})
        out.personal_params = history.final_state.get("personal")
        out.global_client_accuracy = history.other_accuracy.get("global")
        return out


def simulate_local(federation: Federation, model: nn.Module, **kwargs) -> PersonalizedHistory:
    """Local-only training: ``simulate(federation, model, LocalOnly(), **kwargs)``.

    Every client starts from theta_0 and trains only on its own data whenever it is selected;
    nothing is averaged. Keyword arguments are those of :func:`~fedlearn_edu.simulate`.

    Args:
        federation: the clients.
        model: the architecture and theta_0 (not modified).
        **kwargs: keyword arguments of :func:`~fedlearn_edu.simulate`.

    Returns:
        :class:`PersonalizedHistory` with ``personal_params`` (``{name: Tensor[N, ...]}``).

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

    Args:
        federation: the clients.
        model: the architecture and theta_0 (not modified).
        num_clusters: K, the number of cluster models.
        warmup_rounds: rounds of random balanced assignment before the clients' argmin takes over.
        **kwargs: keyword arguments of :func:`~fedlearn_edu.simulate`.

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

    Args:
        federation: the clients.
        model: the architecture and theta_0 (not modified).
        lam: Ditto's lambda >= 0 (0: local training; large: the global model).
        global_strategy: the strategy that trains the global model (default FedAvg).
        personal_epochs: epochs of the personal update (default: the round's local epochs).
        **kwargs: keyword arguments of :func:`~fedlearn_edu.simulate`.

    Returns:
        :class:`PersonalizedHistory`: ``client_accuracy`` of the personal models,
        ``global_client_accuracy`` of the global model, ``final_params`` the global model,
        ``personal_params`` the personal ones; ``diagnostics`` as in ``simulate``
        (the global strategy's own, plus ``conflicts`` with ``diagnostics=("conflicts",)``).
    """
    return PersonalizedHistory.of(simulate(federation, model, Ditto(lam, global_strategy, personal_epochs), **kwargs))

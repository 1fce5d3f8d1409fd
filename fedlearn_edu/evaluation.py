"""Evaluation: every client's accuracy and loss on its local test split, of the model it uses.

:func:`evaluate_clients` evaluates one model (or K stacked ones, client i using model
``which[i]``) on every client; :func:`evaluate_models` evaluates every model a strategy names
(:meth:`~fedlearn_edu.strategies.Strategy.eval_models`: the global model, each client's
personal or cluster model, ...), which is the evaluation step of a round in
:func:`~fedlearn_edu.simulate` and on a Flower node alike; :func:`evaluation_due` says which
rounds are evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from .data.federation import Federation
from .params import Params
from .strategies.base import Strategy

__all__ = ["evaluate_clients", "evaluate_models", "evaluation_due", "PooledTestSplits"]


class PooledTestSplits:
    """All clients' local test splits concatenated once, with the owner of every sample.

    Built once per run and passed to :func:`evaluate_clients` / :func:`evaluate_models` (their
    ``_test``), so that an evaluation does not concatenate the splits again.

    Args:
        federation: the N clients.
        device: where the samples are kept.

    Attributes:
        x: ``Tensor[S, ...]`` the test inputs of every client, client by client.
        y: ``Tensor[S]`` their labels.
        owner: ``Tensor[S]`` (int64) the client of each sample.
        counts: ``Tensor[N]`` (float64) the number of test samples of each client.
        num_clients: N.
    """

    def __init__(self, federation: Federation, device: torch.device):
        self.x = torch.cat([c.test_x for c in federation]).to(device)
        self.y = torch.cat([c.test_y for c in federation]).to(device)
        self.owner = torch.cat([torch.full((c.num_test,), i, dtype=torch.long) for i, c in enumerate(federation)]).to(
            device
        )
        self.counts = torch.bincount(self.owner, minlength=len(federation)).double()
        self.num_clients = len(federation)


@torch.no_grad()
def evaluate_clients(
    model: nn.Module,
    params: Params,
    federation: Federation,
    batch_size: int = 2048,
    which: Tensor | None = None,
    _test: PooledTestSplits | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean loss, on every client's local test split, of the model that client uses.

    Args:
        model: the architecture (used through ``functional_call``).
        params: one model ``{name: Tensor}`` used by every client (``which=None``), or K
            stacked models ``{name: Tensor[K, ...]}``.
        federation: the clients.
        batch_size: test samples per forward pass.
        which: ``Tensor[N]`` (int64): client i uses model ``which[i]`` of the stacked
            ``params`` (``torch.arange(N)``: each client its own personal model; IFCA: the
            cluster ids).

    Returns:
        ``(accuracy: ndarray[N], loss: ndarray[N])``; NaN for a client without test samples.
    """
    names = {n for n, _ in model.named_parameters()}
    missing, unknown = sorted(names - set(params)), sorted(set(params) - names - {n for n, _ in model.named_buffers()})
    if missing or unknown:
        raise ValueError(
            f"params must hold exactly the model's parameters: missing {missing[:5]}, unknown {unknown[:5]} "
            f"(a missing or misspelt key would silently use the module's own tensor)."
        )
    device = next(iter(params.values())).device
    test = _test or PooledTestSplits(federation, device)
    if which is not None and tuple(which.shape) != (test.num_clients,):
        raise ValueError(f"which must be Tensor[N] with N = {test.num_clients} clients; got {tuple(which.shape)}.")
    correct = torch.zeros(test.num_clients, dtype=torch.float64, device=device)
    loss = torch.zeros(test.num_clients, dtype=torch.float64, device=device)
    # One group of test samples per model: all samples for one global model, else the samples
    # of the clients that use model j.
    groups = [None] if which is None else torch.unique(which).tolist()
    sample_model = None if which is None else which.to(device)[test.owner]
    for j in groups:
        p = params if j is None else {k: v[j] for k, v in params.items()}
        idx = None if j is None else (sample_model == j).nonzero().flatten()
        x, y, owner = (test.x, test.y, test.owner) if idx is None else (test.x[idx], test.y[idx], test.owner[idx])
        for start in range(0, y.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            logits = functional_call(model, p, (x[sl],))
            correct.index_add_(0, owner[sl], (logits.argmax(1) == y[sl]).double())
            loss.index_add_(0, owner[sl], F.cross_entropy(logits, y[sl], reduction="none").double())
    counts = test.counts.to(device)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = (correct / counts).cpu().numpy()
        mean_loss = (loss / counts).cpu().numpy()
    return acc, mean_loss


def evaluate_models(
    strategy: Strategy,
    model: nn.Module,
    server_state: Mapping,
    client_state: dict,
    train_sets: Sequence[tuple[Tensor, Tensor]],
    federation: Federation,
    _test: PooledTestSplits | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray, Tensor | None]]:
    """Every model the strategy evaluates, on every client of ``federation`` (a round's evaluation).

    Args:
        strategy: the run's strategy (its :meth:`~fedlearn_edu.strategies.Strategy.eval_models`).
        model: the architecture.
        server_state: the server state.
        client_state: the client state ``{name: Tensor[N, ...]}`` of the N clients of ``federation``.
        train_sets: the clients' ``(x, y)`` training sets (IFCA picks a cluster by its training loss).
        federation: the clients whose test splits are evaluated.

    Returns:
        ``{label: (accuracy: ndarray[N], loss: ndarray[N], which: Tensor[N] or None)}`` in the
        strategy's order: the first is the model ``History.client_accuracy`` is of
        (:meth:`~fedlearn_edu.history.History.add_evaluation`).
    """
    models = strategy.eval_models(model, server_state, client_state, train_sets)
    out = {}
    for label, (params, which) in models.items():
        acc, loss = evaluate_clients(model, params, federation, which=which, _test=_test)
        out[label] = (acc, loss, which)
    return out


def evaluation_due(round: int, eval_every: int, rounds: int) -> bool:
    """Whether round ``round`` is evaluated: every ``eval_every`` rounds, and the last one.

    Args:
        round: t (1-based).
        eval_every: k.
        rounds: T, the last round.

    Returns:
        ``t % k == 0 or t == T``.
    """
    return round % eval_every == 0 or round == rounds

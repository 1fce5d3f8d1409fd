"""DAC, decentralised adaptive clustering (Zec et al., 2022): loss-based neighbour sampling.

Every client i keeps its own model and a row of similarity scores ``s_ij`` to the other
clients (0: unknown), plus which clients it has ever contacted. In each round every
client (all N, in parallel: every rule below reads the scores as they were at the start
of the round)

1. draws n distinct neighbours ``S_i`` with probabilities
   ``p_ij = exp(tau s_ij) / sum_{k != i} exp(tau s_ik)`` (uniform in the first round, when
   every score is 0) -- :func:`dac_probabilities` and :func:`sample_neighbours`;
2. receives their models and scores them on its own training data:
   ``s_ij = 1 / L_i(theta_j)`` for ``j in S_i``;
3. **two-hop update**: for every client j it has never contacted (j not i) that some
   sampled neighbour k knows (``s_kj > 0``), it copies the score of the neighbour most
   similar to itself, ``s_ij = s_{k* j}`` with ``k* = argmax_{k in S_i, s_kj > 0} s_ik``
   (ties: the *last* such k in the order ``S_i`` was drawn, as the authors' stable sort
   ``ki_scores.sort(...); ki_scores[-1]`` picks it; ``ties="first"`` takes the first);
4. averages its model with the received ones weighted by training-set size
   (:func:`neighbour_average_matrix`, :func:`gossip_mix`) and trains locally.

This follows the authors' code (``train_DAC`` in ``utils.py`` of github.com/edvinli/DAC),
except that the update is synchronous (their loop updates clients one after another within
a round, so a client may read scores another client changed earlier in the same round). The
variant DAC-var grows ``tau`` over the rounds, :func:`dac_tau_schedule`. The round structure
of the authors' code -- every client trains once before the first scoring, and which round's
``tau`` a draw uses -- is the strategy's (:class:`~fedlearn_edu.strategies.DAC`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_int, check_positive

__all__ = ["dac_probabilities", "dac_update_similarities", "dac_tau_schedule"]


def _check_scores(similarity) -> Tensor:
    S = torch.as_tensor(similarity, dtype=torch.float64).detach().cpu()
    if S.dim() != 2 or S.shape[0] != S.shape[1] or S.shape[0] < 2:
        raise ValueError(f"similarity must be Tensor[N, N] with N >= 2; got shape {tuple(S.shape)}.")
    if not bool(torch.isfinite(S).all()) or bool((S < 0).any()):
        raise ValueError("similarity scores must be finite and >= 0 (0: not yet known).")
    return S


def dac_probabilities(similarity, tau: float) -> Tensor:
    """DAC's sampling probabilities: ``p_ij = exp(tau s_ij) / sum_{k != i} exp(tau s_ik)``, ``p_ii = 0``.

    Args:
        similarity: ``Tensor[N, N]`` scores ``s_ij >= 0`` (0: unknown); the diagonal is ignored.
        tau: the temperature (>= 0; 0 gives uniform sampling, larger concentrates on the
            most similar clients).

    Returns:
        ``Tensor[N, N]`` (float64), rows summing to 1, zero diagonal.

    Example:
        >>> dac_probabilities(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), tau=math.log(3))
        tensor([[0.0000, 0.7500, 0.2500],
                [0.5000, 0.0000, 0.5000],
                [0.5000, 0.5000, 0.0000]], dtype=torch.float64)
    """
    S = _check_scores(similarity)
    t = check_positive(tau, "tau", allow_zero=True)
    n = S.shape[0]
    off = ~torch.eye(n, dtype=torch.bool)
    z = torch.where(off, t * S, -math.inf)
    return torch.softmax(z, dim=1)


DAC_TIES = ("last", "first")


def dac_update_similarities(similarity, contacted, neighbours, losses, ties: str = "last") -> tuple[Tensor, Tensor]:
    """One round of DAC's score update: direct scores ``1 / L_i(theta_j)`` and the two-hop estimates.

    Args:
        similarity: ``Tensor[N, N]`` scores at the start of the round (0: unknown).
        contacted: boolean ``Tensor[N, N]``, whether i has ever received j's model.
        neighbours: integer ``Tensor[N, n]``, the clients ``S_i`` each client sampled this round.
        losses: ``Tensor[N, n]``, ``losses[i, k]`` the loss of client ``neighbours[i, k]``'s
            model on client i's training data (> 0).
        ties: which of several equally similar sampled neighbours that know j gives its score
            in the two-hop update: ``"last"`` (default, the authors' code) or ``"first"`` in
            the order of ``neighbours[i]``.

    Returns:
        ``(new_similarity, new_contacted)``: new tensors, the inputs are not modified.

    Example:
        >>> S = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 4.0], [0.0, 0.0, 0.0]])
        >>> C = torch.tensor([[False, False, False], [False, False, True], [False, False, False]])
        >>> new, _ = dac_update_similarities(S, C, torch.tensor([[1], [2], [0]]), torch.tensor([[0.5], [0.25], [1.0]]))
        >>> new   # client 0 met 1 (score 2) and learns 1's score of client 2 (4)
        tensor([[0., 2., 4.],
                [0., 0., 4.],
                [1., 0., 0.]], dtype=torch.float64)
    """
    if ties not in DAC_TIES:
        raise ValueError(f"ties must be one of {DAC_TIES}, got {ties!r}.")
    S = _check_scores(similarity)
    n = S.shape[0]
    C = torch.as_tensor(contacted)
    if C.dtype != torch.bool or C.shape != (n, n):
        raise ValueError(f"contacted must be a boolean Tensor[N, N] with N = {n}; got {C.dtype} {tuple(C.shape)}.")
    nb = torch.as_tensor(neighbours)
    if nb.dim() != 2 or nb.shape[0] != n or nb.shape[1] == 0 or nb.is_floating_point() or nb.dtype == torch.bool:
        raise ValueError(
            f"neighbours must be an integer Tensor[N, n] with N = {n}, n >= 1; got shape {tuple(nb.shape)}."
        )
    nb = nb.long().cpu()
    if bool(((nb < 0) | (nb >= n)).any()) or bool((nb == torch.arange(n).unsqueeze(1)).any()):
        raise ValueError("neighbours must index other clients (0 <= j < N, j != i).")
    if bool((nb.sort(dim=1).values.diff(dim=1) == 0).any()):
        raise ValueError("neighbours must not repeat a client within a row.")
    L = torch.as_tensor(losses, dtype=torch.float64).detach().cpu()
    if L.shape != nb.shape:
        raise ValueError(f"losses must be Tensor[N, n] = {tuple(nb.shape)} like neighbours; got {tuple(L.shape)}.")
    if not bool(torch.isfinite(L).all()) or bool((L <= 0).any()):
        bad = int((~torch.isfinite(L) | (L <= 0)).any(dim=1).nonzero()[0])
        raise ValueError(f"losses must be finite and > 0 (scores are 1/loss); row {bad}: {L[bad].tolist()}.")
    direct = 1.0 / L  # s_ik for k in S_i
    new = S.clone()
    new.scatter_(1, nb, direct)
    new_contacted = C.clone().cpu()
    new_contacted.scatter_(1, nb, True)
    # two-hop: s_ij <- s_{k* j}, k* the most similar sampled neighbour that knows j
    hop = S[nb]  # Tensor[N, n, N]: s_kj for k = neighbours[i, .], as at the start of the round
    known = hop > 0
    rank = torch.where(known, direct.unsqueeze(2), -math.inf)
    if ties == "first":
        best = rank.argmax(dim=1, keepdim=True)  # argmax returns the first maximum
    else:  # the last maximum: the first one of the reversed order
        best = nb.shape[1] - 1 - rank.flip(1).argmax(dim=1, keepdim=True)
    estimate = torch.gather(hop, 1, best).squeeze(1)
    fill = known.any(dim=1) & ~new_contacted & ~torch.eye(n, dtype=torch.bool)
    new[fill] = estimate[fill]
    return new, new_contacted


def dac_tau_schedule(round_index: int, tau: float, rate: float = 0.2) -> float:
    """DAC-var's temperature in round t: ``tau_t = 2 tau / (1 + exp(-rate t)) - tau + 1``.

    Starts at 1 (t = 0) and rises towards ``tau + 1``; ``rate = 0.2`` as in the authors' code
    (``tau_function(round, tau, 0.2)``), where ``t`` counts the scoring rounds from 0 and the
    ``tau_t`` computed at the end of round ``t`` weighs the draw of round ``t + 1``.

    Args:
        round_index: ``t``, an int >= 0.
        tau: DAC's ``tau``, >= 0.
        rate: the schedule's rate, > 0.

    Returns:
        ``tau_t``, a float from 1 (``t = 0``) rising towards ``tau + 1``.

    Example:
        >>> dac_tau_schedule(0, 30.0), round(dac_tau_schedule(100, 30.0), 4)
        (1.0, 31.0)
    """
    round_index = check_int(round_index, "round_index", 0)
    t = check_positive(tau, "tau", allow_zero=True)
    r = check_positive(rate, "rate")
    return 2 * t / (1 + math.exp(-r * round_index)) - t + 1

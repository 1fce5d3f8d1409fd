"""Decentralised methods as strategies: Gossip averaging and DAC (no server model).

Every client keeps its own model; there is no global model. In the simulator the N models
are the server state's ``"models"``, ``{name: Tensor[N, ...]}`` (in a deployment row i lives
on client i): a gossip step reads the models of other clients, which the protocol's
per-client state rows (only the selected clients') would not give. In round t each selected
client i

1. receives models from other clients and mixes them with its own, row i of a
   row-stochastic matrix W: ``start_i = sum_j W_ij theta_j``
   (:func:`~fedlearn_edu.aggregators.gossip_mix`);
2. trains ``start_i`` locally and keeps the result: ``theta_i <- theta_i + Delta_i`` with
   ``Delta_i = trained_i - theta_i`` (the "direction" only touches the selected rows;
   the other clients' models stay as they are).

All rows of W are read from the models at the start of the round (a synchronous round).
The driver evaluates each client's own model (``History.evaluated == "personal"``).

* :class:`Gossip`: W from a fixed random graph with Metropolis--Hastings weights (doubly
  stochastic, so full participation without training converges to the average), or the
  "random" baseline of Zec et al. (2022): each client averages with ``num_neighbours``
  uniformly sampled clients, weighted by training-set size.
* :class:`DAC`: neighbours sampled by DAC's loss-based rule with its two-hop score update
  (:mod:`fedlearn_edu.aggregators.dac`), averaged by training-set size.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ..aggregators import (
    dac_probabilities,
    dac_tau_schedule,
    dac_update_similarities,
    gossip_mix,
    metropolis_hastings_weights,
    neighbour_average_matrix,
    random_graph,
    sample_neighbours,
)
from ..checks import check_bool, check_int, check_positive, check_range
from ..params import Params, repeat_params
from ..utils import derive_seed
from .base import ClientOutput, ClientUpdates, ClientWork, Needs, Strategy
from .personalized import client_losses
from .registry import register
from .state import DACState, GossipState, PeerState, updated

__all__ = ["Gossip", "DAC"]

GOSSIP_SEED_TAG = 0x6055
DAC_SEED_TAG = 0xDAC


def _check_num_neighbours(n, allow_none: bool = False) -> int | None:
    """``n`` as a positive ``int`` (or ``None`` when allowed), or a clear error."""
    if n is None and allow_none:
        return None
    return check_int(n, "num_neighbours", 1)


def _sizes(work: ClientWork, who: str) -> Tensor:
    """``Tensor[N]``: all clients' training-set sizes, or a clear error."""
    if work.all_num_samples is None:
        raise ValueError(
            f"{who} weighs neighbours by data size: ClientWork.all_num_samples is needed (simulate sets it)."
        )
    return work.all_num_samples


def _dac_neighbours(similarity: Tensor, tau: float, num_sampled: int, seed: int) -> Tensor:
    """``Tensor[N, n]``: each client's n distinct neighbours, drawn with DAC's ``p_ij ∝ exp(tau s_ij)``.

    Usually one draw without replacement from :func:`~fedlearn_edu.aggregators.dac_probabilities`.
    Once scores ``1 / L`` differ by more than about ``745 / tau`` (a neighbour's model fits a
    client's data closely), the softmax underflows to exact zeros and a row may have fewer than
    n positive entries. The round's draw is then made one neighbour at a time for every row, each
    from the softmax of ``tau s_ij`` over the clients not yet drawn -- the same law (sampling
    without replacement is sequential), with the normalisation redone after every draw so it
    cannot underflow.
    """
    probs = dac_probabilities(similarity, tau)
    if bool(((probs > 0).sum(dim=1) >= num_sampled).all()):
        return sample_neighbours(probs, num_sampled, seed=seed)
    n = probs.shape[0]
    g = torch.Generator().manual_seed(int(seed))
    logits = float(tau) * similarity.detach().to(device="cpu", dtype=torch.float64).clone()
    logits.fill_diagonal_(-float("inf"))
    rows = torch.arange(n)
    out = torch.empty(n, num_sampled, dtype=torch.long)
    for k in range(num_sampled):
        pick = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=g).squeeze(1)
        out[:, k] = pick
        logits[rows, pick] = -float("inf")
    return out


class _Decentralised(Strategy):
    """Shared round of the decentralised methods: mix with row i of W, then train locally.

    Server state: ``models`` (``{name: Tensor[N, ...]}``), ``optimizer`` (``ServerSGD(1)``:
    ``theta_i <- theta_i + Delta_i`` exactly) and the method's own entries.
    """

    needs = Needs(server_model="none", personal=True)
    evaluates = "personal"

    def __init__(self):
        super().__init__(server_lr=1.0)  # theta_i <- theta_i + Delta_i exactly

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """``models``: N copies of theta_0 (no client state).

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device.
            model: the architecture (unused here).
            num_clients: N, the number of models kept.
            seed: the run's seed (unused here).

        Returns:
            ``(server_state, {})``: ``{"models": {name: Tensor[N, ...]}, "optimizer": ...}``.
        """
        models = repeat_params(params, num_clients)
        return PeerState(models=models, optimizer=self.optimizer.init_state(models)), {}

    def server_params(self, server_state: Mapping) -> Params | None:
        """The N clients' models.

        Args:
            server_state: with ``models``.

        Returns:
            ``server_state["models"]``, ``{name: Tensor[N, ...]}``.
        """
        return server_state.get("models")

    def with_server_params(self, server_state: Mapping, params: Params) -> Mapping:
        """``server_state`` with new client models.

        Args:
            server_state: with ``models`` (not modified).
            params: ``{name: Tensor[N, ...]}``.

        Returns:
            ``updated(server_state, models=params)``.
        """
        return updated(server_state, models=params)

    def mixing(self, work: ClientWork, server_state: Mapping) -> tuple[Tensor, dict]:
        """How the selected clients mix the N models this round.

        Args:
            work: the round's clients.
            server_state: the server state (``models`` and the method's own entries).

        Returns:
            ``(W: Tensor[N, N], signals)``: row i says how client i mixes (selected rows used);
            ``signals`` are per selected client (``Tensor[m, ...]``).
        """
        raise NotImplementedError

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """Mix the received models with row i of W, train locally, send ``Delta_i = trained_i - theta_i``.

        Args:
            work: the round's clients.
            server_state: with ``models``.
            state: unused (empty).

        Returns:
            The :class:`ClientOutput` (the mixing's signals, e.g. ``neighbours``).
        """
        models = server_state["models"]
        ids = work.client_ids.to(next(iter(models.values())).device)
        W, signals = self.mixing(work, server_state)
        start = {k: v[ids] for k, v in gossip_mix(models, W).items()}
        local = work.train(None, start=start)
        deltas = {k: local.params[k] - models[k][ids] for k in models}
        return ClientOutput(deltas, local.train_loss, signals)

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g_i = -Delta_i`` on the selected rows (zero elsewhere); diagnostics ``neighbours``.

        Args:
            server_state: with ``models``.
            updates: the round's updates.

        Returns:
            ``(g: {name: Tensor[N, ...]}, server_state, diagnostics)``.
        """
        models = server_state["models"]
        g = {k: torch.zeros_like(v) for k, v in models.items()}
        ids = updates.client_ids.to(next(iter(models.values())).device)
        for k in g:
            g[k][ids] = -updates.deltas[k]
        return g, server_state, {k: v for k, v in updates.signals.items() if k == "neighbours"}

    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """Each client's own model."""
        models = server_state["models"]
        device = next(iter(models.values())).device
        return {"personal": (models, torch.arange(len(train_sets), device=device))}


@register
class Gossip(_Decentralised):
    """Decentralised gossip averaging: each selected client mixes with its neighbours, then trains.

    Args:
        edge_prob: with ``num_neighbours=None``, the edge probability of the fixed connected
            Erdos--Renyi graph (drawn from the run's seed), mixed with Metropolis--Hastings
            weights (:func:`~fedlearn_edu.aggregators.metropolis_hastings_weights`).
        num_neighbours: if given, the randomised gossip of Zec et al.'s "Random" baseline:
            every round each client samples this many other clients uniformly and averages
            with them weighted by training-set size
            (:func:`~fedlearn_edu.aggregators.neighbour_average_matrix`).

    Example:
        >>> Gossip(edge_prob=0.5).name, Gossip(num_neighbours=3).num_neighbours
        ('gossip', 3)
    """

    name = "gossip"

    def __init__(self, edge_prob: float = 0.3, num_neighbours: int | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__()
        self.edge_prob = check_range(edge_prob, "edge_prob", 0, 1, low_open=True)
        self.num_neighbours = _check_num_neighbours(num_neighbours, allow_none=True)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """``models`` plus ``mixing``: the fixed Metropolis--Hastings ``W`` (``Tensor[N, N]``), or ``None``.

        Args:
            params: theta_0, ``{name: Tensor}``, copied N times.
            model: the architecture (unused here).
            num_clients: N, the graph's number of nodes.
            seed: the run's seed; the graph is drawn from ``derive_seed(seed, GOSSIP_SEED_TAG)``.

        Returns:
            ``(server_state, {})``: ``mixing`` is ``None`` with ``num_neighbours`` (sampled each round).

        Raises:
            ValueError: ``num_neighbours`` is not below ``num_clients``.
        """
        mixing = None
        if self.num_neighbours is None:
            graph = random_graph(int(num_clients), self.edge_prob, seed=derive_seed(seed, GOSSIP_SEED_TAG))
            mixing = metropolis_hastings_weights(graph)
        elif self.num_neighbours >= num_clients:
            raise ValueError(f"num_neighbours must be below the number of clients ({num_clients}).")
        server, clients = super().init_state(params, model, num_clients, seed)
        return GossipState(**server, mixing=mixing), clients

    def mixing(self, work: ClientWork, server_state: Mapping) -> tuple[Tensor, dict]:
        """The fixed W, or this round's sampled neighbours averaged by data size.

        Args:
            work: the round's clients (``seed``, ``round``, ``client_ids`` and
                ``all_num_samples``, ``Tensor[N]``, for the size weights).
            server_state: with ``models`` and ``mixing``.

        Returns:
            ``(W: Tensor[N, N], signals)``: the fixed W and ``{}``, or with ``num_neighbours``
            the size-weighted average over sampled neighbours and ``{"neighbours": Tensor[m, n]}``.
        """
        if self.num_neighbours is None:
            return server_state["mixing"], {}
        n = next(iter(server_state["models"].values())).shape[0]
        seed = derive_seed(work.seed, work.round, GOSSIP_SEED_TAG)
        nb = sample_neighbours(torch.ones(n, n), self.num_neighbours, seed=seed)
        return neighbour_average_matrix(nb, _sizes(work, "Gossip")), {"neighbours": nb[work.client_ids]}


@register
class DAC(_Decentralised):
    """DAC, decentralised adaptive clustering (Zec et al., 2022).

    Each round every selected client i samples ``num_neighbours`` clients with
    ``p_ij ∝ exp(tau s_ij)`` (:func:`~fedlearn_edu.aggregators.dac_probabilities`), scores
    them ``s_ij = 1 / L_i(theta_j)`` on its training data, copies two-hop scores
    (:func:`~fedlearn_edu.aggregators.dac_update_similarities`; of equally similar
    neighbours the last drawn, as the authors' stable sort), averages with them weighted by
    training-set size and trains. Only the selected clients' score rows change. A loss is
    floored at 1e-12 before it is inverted (a model that fits a client's data perfectly).

    **Round 1 is the authors' warm-up** (``warmup=True``, default): as ``train_DAC`` in
    github.com/edvinli/DAC trains every client once before the first scoring, in round 1
    each selected client only trains its own model (no models exchanged, no scores,
    ``diagnostics["neighbours"]`` of width 0); scoring starts in round 2, on trained models.
    With ``warmup=False`` round 1 already scores -- the N identical initial models, so every
    sampled neighbour gets the same score ``1 / L_i(theta_0)`` and, at ``tau = 30``, round 2
    keeps drawing round 1's random neighbours. With partial participation only the clients
    selected in round 1 are warmed up (the authors' warm-up covers all N).

    **DAC-var's temperature** is indexed as in the authors' code: with ``r`` the scoring round
    counted from 0 (``r = t - 2`` with warm-up, ``t - 1`` without), the draw of round r uses the
    ``tau`` computed at the end of round ``r - 1``, ``dac_tau_schedule(r - 1)``; the draw of
    scoring round 0 is uniform (no scores yet) at any temperature.

    Args:
        num_neighbours: n, neighbours sampled per round (the paper: 3 to 5).
        tau: the temperature (the paper: 30).
        tau_rate: ``None`` for DAC; a rate (e.g. 0.2) for DAC-var, whose temperature grows as
            :func:`~fedlearn_edu.aggregators.dac_tau_schedule`.
        warmup: round 1 trains every selected client alone before any scoring (the authors').

    The scores ``s`` (``Tensor[N, N]``, float64, 0: unknown) and who has met whom
    (``Tensor[N, N]``, bool) are server state here, ``similarity`` and ``contacted`` (in a real
    deployment row i lives on client i). The selected clients send their new rows as signals
    (``similarity``, ``contacted``: ``Tensor[m, N]``); the server writes them in.
    """

    name = "dac"

    def __init__(self, num_neighbours: int = 3, tau: float = 30.0, tau_rate: float | None = None, warmup: bool = True):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__()
        self.num_neighbours = _check_num_neighbours(num_neighbours)
        tau = check_positive(tau, "tau", allow_zero=True)
        tau_rate = None if tau_rate is None else check_positive(tau_rate, "tau_rate")
        warmup = check_bool(warmup, "warmup")
        self.tau = float(tau)
        self.tau_rate = tau_rate
        self.warmup = warmup

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """``models`` plus ``similarity`` (zeros) and ``contacted`` (false), ``Tensor[N, N]`` each.

        Args:
            params: theta_0, ``{name: Tensor}``, copied N times.
            model: the architecture (unused here).
            num_clients: N.
            seed: the run's seed (unused here; each round's draw uses ``derive_seed(seed, t, DAC_SEED_TAG)``).

        Returns:
            ``(server_state, {})``; ``similarity`` is float64, ``contacted`` bool.

        Raises:
            ValueError: ``num_neighbours`` is not below ``num_clients``.
        """
        n = int(num_clients)
        if self.num_neighbours >= n:
            raise ValueError(f"num_neighbours must be below the number of clients ({n}); got {self.num_neighbours}.")
        server, clients = super().init_state(params, model, num_clients, seed)
        own = {"similarity": torch.zeros(n, n, dtype=torch.float64), "contacted": torch.zeros(n, n, dtype=torch.bool)}
        return DACState(**server, **own), clients

    def scoring_round(self, round_index: int) -> int:
        """The scoring round ``r`` (from 0, the authors' ``round``) of driver round t (from 1).

        Args:
            round_index: t.

        Returns:
            ``r``; -1 for the warm-up round.
        """
        return int(round_index) - 1 - int(self.warmup)

    def temperature(self, round_index: int) -> float:
        """The temperature tau of the neighbour draw in driver round t.

        Args:
            round_index: t.

        Returns:
            ``tau`` for DAC; for DAC-var ``dac_tau_schedule(r - 1)``, ``r`` the scoring round
            (see the class docstring).
        """
        if self.tau_rate is None:
            return self.tau
        return dac_tau_schedule(max(self.scoring_round(round_index) - 1, 0), self.tau, self.tau_rate)

    def mixing(self, work: ClientWork, server_state: Mapping) -> tuple[Tensor, dict]:
        """DAC's neighbour draw and scoring; the selected clients' new score rows as signals.

        Args:
            work: the round's clients (their models' losses on ``work.datasets`` score the
                neighbours; ``all_num_samples``, ``Tensor[N]``, weighs the average).
            server_state: with ``models``, ``similarity`` and ``contacted`` (``Tensor[N, N]``).

        Returns:
            ``(W: Tensor[N, N], signals)``: in the warm-up round the identity and
            ``{"neighbours": Tensor[m, 0]}``; then the size-weighted neighbour average and
            ``{"neighbours": Tensor[m, n], "similarity": Tensor[m, N], "contacted": Tensor[m, N]}``.
        """
        models, similarity = server_state["models"], server_state["similarity"].cpu()  # scores: on the CPU
        n = similarity.shape[0]
        ids = work.client_ids
        if self.scoring_round(work.round) < 0:  # the warm-up: every client keeps its own model
            signals = {"neighbours": torch.zeros(len(ids), 0, dtype=torch.long)}
            return torch.eye(n, dtype=torch.float64), signals
        nb = _dac_neighbours(
            similarity,
            self.temperature(work.round),
            self.num_neighbours,
            seed=derive_seed(work.seed, work.round, DAC_SEED_TAG),
        )
        losses = torch.ones(n, self.num_neighbours, dtype=torch.float64)  # rows of unselected clients: unused
        for j, i in enumerate(ids.tolist()):
            received = {k: v[nb[i].to(v.device)] for k, v in models.items()}
            losses[i] = client_losses(work.model, received, [work.datasets[j]])[0].clamp_min(1e-12)
        # A client whose data give NaN/Inf losses cannot score: its row is computed from stand-in
        # losses (row i depends only on row i) and sent as NaN, so the driver drops the client.
        unscored = ~torch.isfinite(losses).all(dim=1)
        new_s, new_c = dac_update_similarities(
            similarity, server_state["contacted"].cpu(), nb, losses.masked_fill(unscored.unsqueeze(1), 1.0)
        )
        signals = {
            "neighbours": nb[ids],
            "similarity": new_s[ids].masked_fill(unscored[ids].unsqueeze(1), float("nan")),
        }
        signals["contacted"] = new_c[ids]
        return neighbour_average_matrix(nb, _sizes(work, "DAC")), signals

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """The decentralised step; the selected clients' score rows written into the state.

        Args:
            server_state: with ``models``, ``similarity`` and ``contacted``.
            updates: the round's updates (signals ``similarity``/``contacted`` after the warm-up).

        Returns:
            ``(g, server_state with the new scores, {"neighbours"})``.
        """
        g, server_state, diag = super().direction(server_state, updates)
        if "similarity" in updates.signals:
            ids = updates.client_ids
            own = {}
            for key in ("similarity", "contacted"):
                table = server_state[key].clone()
                table[ids.to(table.device)] = updates.signals[key].to(table.device)
                own[key] = table
            server_state = updated(server_state, **own)
        return g, server_state, diag

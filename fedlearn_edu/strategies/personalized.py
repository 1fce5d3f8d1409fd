"""Methods that keep more than one model: local-only training, IFCA and Ditto, as strategies.

They run through :func:`~fedlearn_edu.simulate` like every other method (same
sampling, seeds, engines, NaN checks, checkpoints); what differs is expressed
through the protocol of :mod:`fedlearn_edu.strategies.base`:

======================  ==========================================================
:class:`LocalOnly`      client state ``personal`` (``Tensor[N, ...]``): every client
                        trains its own model; nothing is shared
:class:`IFCA`           the server's parameters are K cluster models
                        (``Tensor[K, ...]``); each client trains the one with the
                        lowest loss on its data; the server averages per cluster
                        (Ghosh et al., 2020)
:class:`Ditto`          a global model trained by any base strategy (FedAvg by
                        default) plus client state ``personal`` pulled towards it:
                        ``v <- v - lr (grad F_i(v) + lam (v - theta_t))``
                        (Li et al., 2021)
======================  ==========================================================

History's ``client_accuracy[e, i]`` is then the accuracy of the model *client i
would use* (its own, its cluster's or its personal model) on client i's local test
split (``History.evaluated`` says which), so the numbers sit in one table with
FedAvg's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from ..aggregators import fedavg
from ..checks import check_int, check_positive
from ..params import Params, get_params, repeat_params, stack_params
from ..utils import derive_seed
from .base import ClientOutput, ClientUpdates, ClientWork, Needs, Strategy, check_base
from .fedavg import FedAvg
from .registry import register
from .state import ClusterState, ServerState, updated
from .wrapper import Wrapper

__all__ = ["LocalOnly", "IFCA", "Ditto", "client_losses"]

DITTO_SEED_TAG = 0xD1770
IFCA_SEED_TAG = 0x1FCA


@torch.no_grad()
def client_losses(model: nn.Module, models: Params, datasets: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """Mean cross-entropy of each of K stacked models on each client's data.

    IFCA's cluster identity estimate is the row-wise argmin.

    Args:
        model: the architecture.
        models: K stacked models ``{name: Tensor[K, ...]}``.
        datasets: m clients' ``(x: Tensor[n_i, ...], y: Tensor[n_i])``.

    Returns:
        ``Tensor[m, K]`` (float64, CPU).
    """
    k = next(iter(models.values())).shape[0]
    out = torch.empty(len(datasets), k, dtype=torch.float64)
    for j in range(k):
        p = {name: v[j] for name, v in models.items()}
        for i, (x, y) in enumerate(datasets):
            out[i, j] = float(F.cross_entropy(functional_call(model, p, (x,)), y))
    return out


def _own_models(num_clients: int, device) -> Tensor:
    return torch.arange(num_clients, device=device)


@register
class LocalOnly(Strategy):
    """Local-only training: every client starts from theta_0 and trains only on its own data.

    Whenever a client is selected it trains its personal model (client state ``personal``)
    for the round's local epochs; nothing is averaged and the server keeps no model (its
    state is empty): the lower bound on what collaboration must beat, and the upper bound
    when clients have plenty of data and conflicting tasks.
    """

    name = "local"
    needs = Needs(server_model="none", personal=True)
    evaluates = "personal"

    def __init__(self):
        """No hyper-parameters: the server keeps no model and takes no step (no ``server_lr``, no ``optimizer``)."""
        super().__init__()

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """No server state; client state ``personal`` (N copies of theta_0).

        Args:
            params: theta_0, ``{name: Tensor}``, every client's starting model.
            model: the architecture (unused here).
            num_clients: N.
            seed: the run's seed (unused here).

        Returns:
            ``({}, {"personal": {name: Tensor[N, ...]}})``.
        """
        return ServerState(), {"personal": repeat_params(params, num_clients)}

    def client_view(self, server_state: Mapping) -> dict:
        """Nothing: the clients read no server state.

        Args:
            server_state: the (empty) server state.

        Returns:
            ``{}``.
        """
        return {}

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """Train the selected clients' personal models; the new rows are the client state.

        Args:
            work: the round's clients.
            server_state: unused (empty).
            state: the selected rows ``{"personal": {name: Tensor[m, ...]}}``.

        Returns:
            The :class:`ClientOutput`.
        """
        personal = state["personal"]
        local = work.train(None, start=personal)
        deltas = {k: local.params[k] - personal[k] for k in personal}
        return ClientOutput(deltas, local.train_loss, state={"personal": local.params})

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """No server model, so no pseudo-gradient: an empty one (:meth:`aggregate` takes no step).

        Args:
            server_state: the (empty) server state, returned as given.
            updates: the round's updates (unused).

        Returns:
            ``({}, server_state, {})``.
        """
        return {}, server_state, {}

    def aggregate(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Mapping, dict]:
        """No server step: the (empty) state unchanged, no diagnostics.

        Args:
            server_state: the (empty) server state, returned as given.
            updates: the round's updates (unused).

        Returns:
            ``(server_state, {})``.
        """
        return server_state, {}

    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """Each client's personal model.

        Args:
            model: the architecture (unused here).
            server_state: the (empty) server state (unused).
            state: the client state, with ``personal`` ``{name: Tensor[N, ...]}``.
            train_sets: the N clients' training sets (only their number is used).

        Returns:
            ``{"personal": (personal, arange(N))}``: client i uses row i.
        """
        personal = state["personal"]
        return {"personal": (personal, _own_models(len(train_sets), next(iter(personal.values())).device))}


def _reinit(model: nn.Module, seed: int) -> Params:
    """Parameters of a fresh initialisation of ``model``'s architecture, seeded."""
    clone = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mod in clone.modules():
            if hasattr(mod, "reset_parameters") and mod is not clone:
                mod.reset_parameters()
    return get_params(clone)


@register
class IFCA(Strategy):
    """IFCA (Ghosh et al., 2020), model-averaging variant.

    The server keeps K cluster models theta^1..theta^K (cluster 1 starts from the
    model's parameters, the others from fresh seeded initialisations). Each round every
    selected client i

    1. estimates its cluster: ``j_i = argmin_j F_i(theta^j)`` (mean training loss);
    2. trains theta^{j_i} locally and sends ``Delta_i`` with ``j_i``;

    and the server averages per cluster, ``theta^j += sum_{i: j_i = j} p_i Delta_i`` with
    ``p_i`` proportional to n_i within the cluster (a cluster nobody picked stays): the
    direction ``g^j = -sum_{i: j_i = j} p_i Delta_i`` under the server optimizer. At
    evaluation every client uses the cluster model with its lowest training loss.

    Warm-up (**ours**, off by default): for ``warmup_rounds`` rounds the selected clients
    are dealt to the K clusters at random, in equal numbers, instead of by the argmin. From
    random initial models the argmin can send *every* client to the same model in round 1;
    that model then improves for everyone and the other K - 1 are never picked again. The
    IFCA paper counters this with several random restarts; one warm-up round is a cheaper
    remedy. ``warmup_rounds=0`` is the plain algorithm.

    Args:
        num_clusters: K.
        warmup_rounds: rounds of random balanced assignment before the argmin takes over.
        server_lr: eta_s (1: the plain per-cluster average).

    Server state: ``clusters`` (``{name: Tensor[K, ...]}``) and ``optimizer``. Client state:
    ``cluster`` (``Tensor[N]``, int64), the cluster each client picked when it was last
    selected (-1 before). Diagnostics: ``assignment`` (``Tensor[m]``) and ``cluster_sizes``
    (``Tensor[K]``).
    """

    name = "ifca"
    needs = Needs(signals={"cluster"}, server_model="clusters")
    evaluates = "cluster"

    def __init__(self, num_clusters: int, warmup_rounds: int = 0, server_lr: float = 1.0):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        self.num_clusters = check_int(num_clusters, "num_clusters", 1)
        self.warmup_rounds = check_int(warmup_rounds, "warmup_rounds", 0)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """The K cluster models (cluster 0 is theta_0) and the client state ``cluster`` (-1).

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device (cluster 0).
            model: the architecture; clusters 1..K-1 are fresh initialisations of it.
            num_clients: N, the length of ``cluster``.
            seed: the run's seed; cluster j is initialised from ``derive_seed(seed, IFCA_SEED_TAG, j)``.

        Returns:
            ``({"clusters": {name: Tensor[K, ...]}, "optimizer": ...}, {"cluster": Tensor[N]})``.

        Raises:
            ValueError: more clusters than clients (``num_clusters`` > N).
        """
        if self.num_clusters > num_clients:
            raise ValueError(
                f"IFCA(num_clusters={self.num_clusters}) needs at most one cluster per client, and the federation "
                f"has {num_clients} clients; use num_clusters <= {num_clients} (the number of groups the clients "
                "form, e.g. 2 to 4)."
            )
        device = next(iter(params.values())).device
        others = [
            {n: v.to(device) for n, v in _reinit(model, derive_seed(seed, IFCA_SEED_TAG, j)).items()}
            for j in range(1, self.num_clusters)
        ]
        clusters = stack_params([params, *others])
        server = ClusterState(clusters=clusters, optimizer=self.optimizer.init_state(clusters))
        return server, {"cluster": torch.full((num_clients,), -1, dtype=torch.long, device=device)}

    def server_params(self, server_state: Mapping) -> Params:
        """The K cluster models.

        Args:
            server_state: with ``clusters``.

        Returns:
            ``server_state["clusters"]``, ``{name: Tensor[K, ...]}``.
        """
        return server_state.get("clusters")

    def with_server_params(self, server_state: Mapping, params: Params) -> Mapping:
        """``server_state`` with new cluster models.

        Args:
            server_state: with ``clusters`` (not modified).
            params: ``{name: Tensor[K, ...]}``.

        Returns:
            ``updated(server_state, clusters=params)``.
        """
        return updated(server_state, clusters=params)

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """Pick each client's cluster (or deal them at random in the warm-up) and train it.

        Args:
            work: the round's clients.
            server_state: with ``clusters``.
            state: the selected rows of ``cluster``.

        Returns:
            The :class:`ClientOutput` (signal and new state ``cluster``, ``Tensor[m]``).
        """
        params = server_state["clusters"]
        device = next(iter(params.values())).device
        m = len(work.datasets)
        if work.round <= self.warmup_rounds:
            g = torch.Generator().manual_seed(derive_seed(work.seed, work.round, IFCA_SEED_TAG))
            assign = (torch.randperm(m, generator=g) % self.num_clusters).to(device)
        else:
            assign = client_losses(work.model, params, work.datasets).argmin(1).to(device)
        start = {n: v[assign] for n, v in params.items()}
        local = work.train(None, start=start)
        deltas = {n: local.params[n] - start[n] for n in start}
        return ClientOutput(deltas, local.train_loss, {"cluster": assign}, {"cluster": assign})

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g^j = -sum_{i: j_i = j} p_i Delta_i`` per cluster (zero for a cluster nobody picked).

        Args:
            server_state: with ``clusters``.
            updates: the round's updates, with ``signals["cluster"]``.

        Returns:
            ``(g: {name: Tensor[K, ...]}, server_state, {"assignment", "cluster_sizes"})``.
        """
        params = server_state["clusters"]
        assign = updates.signals["cluster"]
        device = assign.device
        sizes = updates.num_samples.to(device, torch.float64)
        g = {n: torch.zeros_like(v) for n, v in params.items()}
        for j in range(self.num_clusters):
            members = (assign == j).nonzero().flatten()
            if members.numel() == 0:
                continue
            step = fedavg({n: d[members] for n, d in updates.deltas.items()}, sizes[members])
            for n in g:
                g[n][j] = -step[n]
        counts = torch.bincount(assign, minlength=self.num_clusters)
        return g, server_state, {"assignment": assign.cpu(), "cluster_sizes": counts.cpu()}

    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """Every client's best cluster on its training data.

        Args:
            model: the architecture.
            server_state: with ``clusters`` ``{name: Tensor[K, ...]}``.
            state: the client state (unused: the pick is made afresh, not the last one).
            train_sets: the N clients' training sets, on which each client's cluster
                losses are computed.

        Returns:
            ``{"cluster": (clusters, which)}``, ``which`` ``Tensor[N]`` the argmin of each
            client's mean training loss over the K clusters.
        """
        clusters = server_state["clusters"]
        return {"cluster": (clusters, client_losses(model, clusters, train_sets).argmin(1))}


@register
class Ditto(Wrapper):
    """Ditto (Li et al., 2021): a global model plus one personal model per client.

    Each round every selected client i

    1. runs the base strategy's client update from theta_t (the global part, sent as
       ``Delta_i``);
    2. updates its personal model v_i (client state ``personal``) for ``personal_epochs``
       epochs on ``F_i(v) + (lam / 2) ||v - theta_t||^2`` -- the engines' local objective with
       ``start = v_i`` and ``prox_mu = lam`` -- with its own batch order; v_i never leaves
       the client.

    The server turns the ``Delta_i`` into theta_{t+1} with the base strategy (FedAvg by
    default; any one-model :class:`~fedlearn_edu.Strategy`, e.g. CRAFT: "Ditto + CRAFT"),
    whose server state is Ditto's ``"base"`` entry. Ditto is a
    :class:`~fedlearn_edu.strategies.wrapper.Wrapper` that overrides the client update and the
    evaluation; every other hook is the base's. Personal models start at theta_0. The
    driver evaluates the personal models (``History.client_accuracy``) and the global one
    (``History.other_accuracy["global"]``).

    Args:
        lam: Ditto's lambda >= 0 (0.1; the paper tunes it in {0.05, ..., 2}).
        base: the global model's strategy (default ``FedAvg()``); not IFCA, local-only or
            decentralised training (no one global model) nor Ditto itself.
        personal_epochs: epochs of the personal update (default: the round's local epochs).
    """

    name = "ditto"  # the registry's; an instance over another base is named "ditto+<base>"
    wraps = frozenset({"state", "client", "evaluation"})  # personal models; the base's server step
    default_base = "fedavg"
    evaluates = "personal"

    def __init__(self, lam: float = 0.1, base: Strategy | None = None, personal_epochs: int | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        base = FedAvg() if base is None else base
        check_base("Ditto", base, reweights=False)
        lam = check_positive(lam, "Ditto's lam", allow_zero=True)
        if personal_epochs is not None:
            personal_epochs = check_int(personal_epochs, "personal_epochs", 1)
        super().__init__(base)
        self.lam = float(lam)
        self.personal_epochs = personal_epochs
        self.name = "ditto" if type(base) is FedAvg else f"ditto+{getattr(base, 'name', type(base).__name__)}"

    @property
    def needs(self) -> Needs:
        """The base strategy's needs, personalised."""
        return replace(self.base.needs, personal=True)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """``{"base": the base's server state}``; the base's client state plus ``personal`` (theta_0).

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device.
            model: the architecture (passed to the base).
            num_clients: N, the rows of ``personal``.
            seed: the run's seed (passed to the base).

        Returns:
            ``(server_state, client_state)``: ``personal`` is ``{name: Tensor[N, ...]}``, N
            copies of the base's initial global model.
        """
        server, state = super().init_state(params, model, num_clients, seed)
        return server, {**state, "personal": repeat_params(self.server_params(server), num_clients)}

    def client_update(self, work: ClientWork, server_state: Mapping, state: dict) -> ClientOutput:
        """The base's client update, then the personal step anchored at theta_t.

        Args:
            work: the round's clients.
            server_state: ``{"base": ...}`` (or its :meth:`client_view`).
            state: the selected rows: the base's client state plus ``personal``.

        Returns:
            The base's :class:`ClientOutput` with ``personal`` added to the state and the
            personal models' loss recorded.
        """
        base_rows = {k: v for k, v in state.items() if k != "personal"}
        out = super().client_update(work, server_state, base_rows)
        epochs = work.config.epochs if self.personal_epochs is None else self.personal_epochs
        personal = work.train(
            self.server_params(server_state),
            start=state["personal"],
            config=work.config.replace(epochs=epochs, prox_mu=self.lam),
            seeds=work.derived_seeds(DITTO_SEED_TAG),
        )
        return ClientOutput(
            out.deltas,
            out.train_loss,
            out.signals,
            {**out.state, "personal": personal.params},
            recorded_loss=personal.train_loss,
        )

    def eval_models(self, model: nn.Module, server_state: Mapping, state: dict, train_sets) -> dict:
        """The personal models first, then the base's (``"global"``).

        Args:
            model: the architecture.
            server_state: Ditto's server state ``{"base": ...}``.
            state: the client state, with ``personal`` ``{name: Tensor[N, ...]}``.
            train_sets: the N clients' training sets.

        Returns:
            ``{"personal": (personal, arange(N)), **base.eval_models(...)}``.
        """
        personal = state["personal"]
        return {
            "personal": (personal, _own_models(len(train_sets), next(iter(personal.values())).device)),
            **super().eval_models(model, server_state, state, train_sets),
        }

    def __repr__(self) -> str:
        """``Ditto(lam=..., base=..., personal_epochs=...)``."""
        return f"Ditto(lam={self.lam!r}, base={self.base!r}, personal_epochs={self.personal_epochs!r})"

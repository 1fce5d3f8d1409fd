"""Robust aggregation strategies: a robust rule in place of FedAvg's weighted mean, any server optimizer.

Each strategy's direction is ``g = -R(Delta_1, ..., Delta_m)`` for its rule R (the pure
functions of :mod:`fedlearn_edu.aggregators.robust`), applied by the strategy's server
optimizer (``ServerSGD(1)`` by default: ``theta_{t+1} = theta_t + R(...)``). The rules
treat the clients alike (no data-size weights, which an attacker could inflate), except
the geometric median and norm clipping, which take ``weighting="size"`` (default) or
``"uniform"``. ``f`` (the number of faulty clients assumed) defaults to the largest the
rule tolerates for the round's m: ``floor((m - 3) / 2)`` for Krum, ``floor((m - 3) / 4)``
for Bulyan. ``layerwise=True`` runs the norm-based rules (Krum, Multi-Krum, Bulyan, the
geometric median, clipping) once per layer group (:func:`fedlearn_edu.params.layer_groups`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..aggregators import fedavg
from ..aggregators.robust import (
    MAX_ITERATIONS,
    bulyan,
    bulyan_select,
    centered_clipping,
    coordinate_median,
    geometric_median,
    krum,
    krum_select,
    max_bulyan_f,
    max_krum_f,
    norm_clip,
    trimmed_mean,
)
from ..checks import check_bool, check_int, check_positive, check_range
from ..params import Params, layer_groups
from .base import ClientUpdates, Needs, Strategy
from .registry import register
from .server_optim import ServerOptimizer
from .state import CenteredClippingState, updated

__all__ = [
    "Median",
    "TrimmedMean",
    "Krum",
    "MultiKrum",
    "Bulyan",
    "GeometricMedian",
    "CenteredClipping",
    "NormClipping",
]

WEIGHTING = ("size", "uniform")


def _check_f(f) -> int | None:
    return None if f is None else check_int(f, "f", 0)


def _f_for(rule: str, f: int | None, m: int, largest) -> int:
    """The f a Krum-type rule uses with m clients: ``f``, or ``largest(m)`` when ``None``.

    With ``f=None`` and fewer than the 3 clients the rule needs even at f = 0, the message
    names the round's number of clients and that minimum (not an f the caller never gave);
    an ``f`` too large for m is refused by the aggregator (naming f and m).
    """
    if f is None and largest(m) < 0:
        raise ValueError(
            f"{rule} needs at least 3 clients per round (f = 0 faulty), got {m}: raise clients_per_round "
            "to 3 or more (and use a federation with at least 3 clients)."
        )
    return largest(m) if f is None else f


def _check_weighting(weighting) -> str:
    if weighting not in WEIGHTING:
        raise ValueError(f"weighting must be one of {WEIGHTING}, got {weighting!r}.")
    return weighting


class _Robust(Strategy):
    """A robust rule's aggregate ``A`` as the update: ``g = -A``; subclasses define :meth:`robust`."""

    needs = Needs()
    layerwise = False

    def __init__(
        self, server_lr: float | None = None, optimizer: ServerOptimizer | None = None, layerwise: bool = False
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer)
        self.layerwise = check_bool(layerwise, "layerwise")

    def robust(self, deltas: Params, updates: ClientUpdates, server_state: Mapping) -> tuple[Params, dict, dict]:
        """The rule on (a group of) the updates.

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(aggregate {name: Tensor[...]}, new entries of the server state, diagnostics)``.
        """
        raise NotImplementedError

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """``g = -A``, A the rule's aggregate (per layer group when ``layerwise``).

        Args:
            server_state: the server state (not modified).
            updates: the round's updates.

        Returns:
            ``(g, server_state, diagnostics)``; with ``layerwise`` the diagnostics are per group
            (``{name: {group: value}}``).
        """
        deltas = updates.deltas
        if not self.layerwise:
            agg, new, diag = self.robust(deltas, updates, server_state)
        else:
            agg, new, diag = {}, {}, {}
            for group, names in layer_groups(list(deltas)).items():
                a, n, d = self.robust({k: deltas[k] for k in names}, updates, server_state)
                agg.update(a)
                for k, v in n.items():
                    new.setdefault(k, {}).update(v)
                for k, v in d.items():
                    diag.setdefault(k, {})[group] = v
        g = {k: -agg[k] for k in deltas}
        return g, updated(server_state, **new), diag


@register
class Median(_Robust):
    """Coordinate-wise median of the updates (Yin et al., 2018): ``g = -median_i Delta_i``.

    Breakdown point 1/2: fewer than half the clients cannot move a coordinate outside the
    honest clients' range.

    Args:
        server_lr: eta_s (used when ``optimizer`` is not given).
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).

    Example:
        >>> strategy = Median()
    """

    name = "median"

    def __init__(self, server_lr: float | None = None, optimizer: ServerOptimizer | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer)

    def robust(self, deltas, updates, server_state):
        """The coordinate-wise median (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(median {name: Tensor[...]}, {}, {})``.
        """
        return coordinate_median(deltas, check=not updates.checked), {}, {}


@register
class TrimmedMean(_Robust):
    """Coordinate-wise trimmed mean (Yin et al., 2018): drop ``floor(beta m)`` values at each end.

    Args:
        beta: the fraction trimmed at each end, in ``[0, 0.5)`` (0: the plain mean).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
    """

    name = "trimmedmean"

    def __init__(self, beta: float = 0.1, server_lr: float | None = None, optimizer: ServerOptimizer | None = None):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer)
        self.beta = check_range(beta, "beta", 0.0, 0.5, high_open=True)

    def robust(self, deltas, updates, server_state):
        """The trimmed mean (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(trimmed mean {name: Tensor[...]}, {}, {})``.
        """
        return trimmed_mean(deltas, self.beta, check=not updates.checked), {}, {}


@register
class Krum(_Robust):
    """Krum (Blanchard et al., 2017): the update of the client closest to its m - f - 2 nearest others.

    Args:
        f: the number of faulty clients assumed (``2f + 2 < m``; ``None``: the largest, ``floor((m-3)/2)``).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        layerwise: pick one client per layer group.

    Diagnostics: ``selected`` (``Tensor[k]`` the chosen clients' ids).
    """

    name = "krum"

    def __init__(
        self,
        f: int | None = None,
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        layerwise=False,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer, layerwise)
        self.f = _check_f(f)

    def min_clients_per_round(self) -> int:
        """``2f + 3`` (Krum's ``2f + 2 < m``; 3 with ``f=None``, the fewest at f = 0).

        Returns:
            The smallest m.
        """
        return 3 if self.f is None else 2 * self.f + 3

    def f_for(self, m: int) -> int:
        """The f used with m clients (``self.f``, or the largest Krum tolerates).

        Args:
            m: the round's number of clients.

        Returns:
            f.

        Raises:
            ValueError: ``f`` is ``None`` and m < 3, the fewest clients Krum takes; the message
                names m and that minimum.
        """
        return _f_for(type(self).__name__, self.f, m, max_krum_f)

    def k_for(self, m: int) -> int:
        """How many clients are averaged with m clients (1 for Krum).

        Args:
            m: the round's number of clients.

        Returns:
            k.
        """
        return 1

    def robust(self, deltas, updates, server_state):
        """Krum / Multi-Krum (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(the chosen update, or the mean of the k chosen, {}, {"selected": client ids})``.
        """
        m = updates.num_clients
        f, k = self.f_for(m), self.k_for(m)
        chosen = krum_select(deltas, f, k, check=not updates.checked)
        return krum(deltas, f, k, check=not updates.checked), {}, {"selected": updates.client_ids[chosen.cpu()]}


@register
class MultiKrum(Krum):
    """Multi-Krum (Blanchard et al., 2017): the plain mean of the k updates with the lowest Krum scores.

    Args:
        f: the number of faulty clients assumed (``2f + 2 < m``; ``None``: the largest).
        k: how many are averaged (``None``: ``m - f``, Blanchard et al.'s choice).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        layerwise: select per layer group.
    """

    name = "multikrum"

    def __init__(
        self,
        f: int | None = None,
        k: int | None = None,
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        layerwise: bool = False,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(f, server_lr, optimizer, layerwise)
        self.k = None if k is None else check_int(k, "k", 1)

    def k_for(self, m: int) -> int:
        """``self.k``, or ``m - f`` (see the class docstring).

        Args:
            m: the round's number of clients.

        Returns:
            k.
        """
        return m - self.f_for(m) if self.k is None else self.k


@register
class Bulyan(_Robust):
    """Bulyan (El Mhamdi et al., 2018): repeated Krum selects m - 2f, then a trimmed mean around the median.

    Args:
        f: the number of faulty clients assumed (``4f + 3 <= m``; ``None``: the largest, ``floor((m-3)/4)``).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        layerwise: one Bulyan per layer group.

    Diagnostics: ``selected`` (the ids Krum selected).
    """

    name = "bulyan"

    def __init__(
        self,
        f: int | None = None,
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        layerwise=False,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer, layerwise)
        self.f = _check_f(f)

    def min_clients_per_round(self) -> int:
        """``4f + 3`` (3 with ``f=None``).

        Returns:
            The smallest m.
        """
        return 3 if self.f is None else 4 * self.f + 3

    def robust(self, deltas, updates, server_state):
        """Bulyan (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(Bulyan's aggregate {name: Tensor[...]}, {}, {"selected": client ids})``.

        Raises:
            ValueError: fewer than ``4f + 3`` clients (3 when f is ``None``); the message names
                the round's number of clients and the minimum.
        """
        m = updates.num_clients
        f = _f_for("Bulyan", self.f, m, max_bulyan_f)
        chosen = bulyan_select(deltas, f, check=not updates.checked)
        return bulyan(deltas, f, check=not updates.checked), {}, {"selected": updates.client_ids[chosen.cpu()]}


@register
class GeometricMedian(_Robust):
    """RFA (Pillutla, Kakade & Harchaoui, 2022): the geometric median of the updates by smoothed Weiszfeld.

    ``argmin_z sum_i alpha_i ||z - Delta_i||`` with ``alpha_i = n_i / sum_j n_j``
    (``weighting="size"``, the paper's) or ``1/m``.

    Args:
        nu: the smoothing (distance floor) nu > 0.
        iterations: the most Weiszfeld steps per round (at most ``MAX_ITERATIONS``, 100000).
        ftol: relative tolerance on the objective (RFA's stopping rule).
        weighting: ``"size"`` or ``"uniform"``.
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        layerwise: one geometric median per layer group.

    Diagnostics: ``iterations`` (Weiszfeld steps taken).
    """

    name = "geometricmedian"

    def __init__(
        self,
        nu: float = 1e-6,
        iterations: int = 10,
        ftol: float = 1e-6,
        weighting: str = "size",
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        layerwise: bool = False,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer, layerwise)
        self.nu = check_positive(nu, "nu")
        self.iterations = check_int(iterations, "iterations", 1, MAX_ITERATIONS)
        self.ftol = check_positive(ftol, "ftol", allow_zero=True)
        self.weighting = _check_weighting(weighting)

    def robust(self, deltas, updates, server_state):
        """The geometric median (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(geometric median {name: Tensor[...]}, {}, {"iterations": Weiszfeld steps taken})``.
        """
        w = updates.size_weights if self.weighting == "size" else None
        z, steps = geometric_median(deltas, w, self.nu, self.iterations, self.ftol, check=not updates.checked)
        return z, {}, {"iterations": steps}


@register
class NormClipping(_Robust):
    """Norm clipping (Sun et al., 2019): each update scaled to norm <= C, then FedAvg's mean.

    ``g = -sum_i p_i Delta_i min(1, C / ||Delta_i||)``, ``p_i`` by data size (``weighting="size"``)
    or ``1/m``.

    Args:
        clip: C > 0.
        weighting: ``"size"`` or ``"uniform"``.
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        layerwise: clip each layer group to C.

    Diagnostics: ``clipped`` (``Tensor[m]`` the factors ``min(1, C / ||Delta_i||)``).
    """

    name = "normclipping"
    needs = Needs(sums_only=True)  # each client clips its own update; the server sums

    def __init__(
        self,
        clip: float = 1.0,
        weighting: str = "size",
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        layerwise: bool = False,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer, layerwise)
        self.clip = check_positive(clip, "clip")
        self.weighting = _check_weighting(weighting)

    def robust(self, deltas, updates, server_state):
        """Clip, then the weighted mean (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(the mean of the clipped updates, {}, {"clipped": Tensor[m] clipping factors})``.
        """
        clipped, factors = norm_clip(deltas, self.clip, check=not updates.checked)
        m = updates.num_clients
        w = updates.size_weights if self.weighting == "size" else torch.full((m,), 1.0 / m)
        return fedavg(clipped, w), {}, {"clipped": factors}


@register
class CenteredClipping(_Robust):
    """Centered clipping (Karimireddy, He & Jaggi, 2021): clip the updates around the last aggregate.

    The server state keeps the centre ``center`` (v, zero at round 0): each round, L times
    ``v <- v + (1/m) sum_i clip_tau(Delta_i - v)``; ``g = -v``, and v is kept for the next round.

    Args:
        tau: the clipping radius tau > 0.
        iterations: L, in ``[1, MAX_ITERATIONS]`` (100000).
        server_lr: eta_s.
        optimizer: the server optimizer (default ``ServerSGD(server_lr)``).
        layerwise: clip each layer group's difference to tau.
    """

    name = "centeredclipping"

    def __init__(
        self,
        tau: float = 1.0,
        iterations: int = 1,
        server_lr: float | None = None,
        optimizer: ServerOptimizer | None = None,
        layerwise: bool = False,
    ):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr, optimizer, layerwise)
        self.tau = check_positive(tau, "tau")
        self.iterations = check_int(iterations, "iterations", 1, MAX_ITERATIONS)

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """FedAvg's server state plus ``center`` (v = 0, shaped like the model).

        Args:
            params: theta_0.
            model: the architecture.
            num_clients: N.
            seed: the run's seed.

        Returns:
            ``(server_state, {})``.
        """
        server, clients = super().init_state(params, model, num_clients, seed)
        return CenteredClippingState(**server, center={k: torch.zeros_like(v) for k, v in params.items()}), clients

    def robust(self, deltas, updates, server_state):
        """Centered clipping from the stored centre (see :meth:`_Robust.robust`).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` (all the updates, or one layer group's).
            updates: the round's updates (ids, sizes).
            server_state: the server state (not modified).

        Returns:
            ``(v, {"center": v}, {})``: the new centre is the aggregate and is kept for the next round.
        """
        v = {k: server_state["center"][k] for k in deltas}
        new_v = centered_clipping(deltas, self.tau, self.iterations, v, check=not updates.checked)
        return new_v, {"center": {k: t.detach().clone() for k, t in new_v.items()}}, {}

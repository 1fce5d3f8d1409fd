"""Attacks and faulty clients as a federation's behaviour, for :func:`fedlearn_edu.simulate` (``attack=``).

An :class:`Attack` names a kind, the fraction of the N clients that attack (chosen by
its own seed: ``round(fraction N)`` clients, :meth:`Attack.attackers`) and the kind's
parameters. A fraction that rounds to no attacker or to all N clients is refused
(:func:`num_attackers`): the run would be the clean federation labelled as attacked, or
have no honest client to attack (or, for ALIE, to imitate). ``History.attackers`` records
who attacked.

An attack is a transform of the clients' output with its own state, as a server optimizer
is a transform of the direction: :meth:`Attack.init` starts its :class:`AttackState` (the
attackers, and theta_{t-1} for the stale free-rider), :meth:`Attack.poison` gives the
federation the clients train on (label flipping), and each round :meth:`Attack.update` maps
the round's updates and the state to the updates the server receives and the next state.
:func:`~fedlearn_edu.simulate` only calls them (and checkpoints the state)::

    state = attack.init(num_clients, strategy)
    federation = attack.poison(federation, state)
    for t in rounds:
        out = strategy.client_update(...)
        out.deltas, state = attack.update(out.deltas, ids, state, t, theta_t, strategy.server_lr)

* ``"label_flip"`` (data level): the attackers train on ``y -> C - 1 - y``
  (:func:`fedlearn_edu.data.reverse_labels`; test labels stay clean);

the update-level kinds replace the attackers' rows of the round's stacked updates
``{name: Tensor[m, ...]}`` before aggregation (:meth:`Attack.apply`, a pure function):

* ``"sign_flip"``: ``Delta_i -> -s Delta_i`` (``scale`` s, 1 by default);
* ``"scale"``: ``Delta_i -> s Delta_i``;
* ``"gaussian"``: ``Delta_i ~ N(0, sigma^2 I)`` (seeded by the attack's seed, the round and the client);
* ``"alie"`` ("A little is enough", Baruch, Baruch & Goldberg, NeurIPS 2019): every attacker
  sends ``mu_j - z sigma_j`` per coordinate, mu and sigma the mean and (population) standard
  deviation of the round's honest updates, ``z = Phi^{-1}((n - s) / n)`` with
  ``s = floor(n / 2 + 1) - f`` for the round's n selected clients of which f attack (s
  clamped to >= 1); in a round whose selected clients all attack (few clients per round)
  there is no honest update to imitate, and they send their own;
* ``"model_replacement"`` (Bagdasaryan et al., AISTATS 2020): ``(m / eta_s)(X - theta_t)``
  for the round's m clients, the server's step size eta_s and the attacker's target model X
  (``target``), so that FedAvg's step lands on X;
* ``"free_rider"``: a zero update (the client trains nothing and still takes part);
* ``"stale_free_rider"``: the previous round's *global* update ``theta_t - theta_{t-1}`` sent
  as the client's own (the "delta weights" free-rider of Lin et al., 2019, "Free-riders in
  federated learning: attacks and defenses"; Fraboni et al., AISTATS 2021): it trains
  nothing, yet its update looks like an honest one (under FedAvg with eta_s = 1 it is last
  round's average update), which a zero update does not. In round 1 there is no previous
  model and it sends zero. Strategies with one global model only; the driver keeps
  theta_{t-1} (and checkpoints it, so a resumed run is the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist
from typing import NamedTuple

import torch
from torch import Tensor

from .checks import check_float, check_int, check_positive, check_range, check_seed
from .data.federation import Federation
from .data.noise import reverse_labels
from .params import Params
from .utils import derive_seed

__all__ = ["Attack", "AttackState", "ATTACKS", "alie_z", "num_attackers"]

ATTACKS = (
    "label_flip",
    "sign_flip",
    "scale",
    "gaussian",
    "alie",
    "model_replacement",
    "free_rider",
    "stale_free_rider",
)
_TAG_CHOICE, _TAG_NOISE = 0xA77AC4, 0x6A055
# the fields beyond kind, fraction and seed that each kind reads; any other is refused unless left at
# its default (a sigma given to a sign flip would be ignored without a word)
USES = {"sign_flip": ("scale",), "scale": ("scale",), "gaussian": ("sigma",), "model_replacement": ("target",)}
_DEFAULTS = {"scale": 1.0, "sigma": 1.0, "target": None}


_FRACTION_WHY = "(use attack=None for a run without attackers; one client at least must stay honest)"


def _check_fraction(fraction) -> float:
    return check_range(fraction, "fraction", 0.0, 1.0, low_open=True, high_open=True, why=_FRACTION_WHY)


def num_attackers(fraction: float, num_clients: int) -> int:
    """How many of ``num_clients`` clients attack: ``round(fraction N)``, refused unless ``1 <= k <= N - 1``.

    Args:
        fraction: the attacking share, in ``(0, 1)``.
        num_clients: N >= 2.

    Returns:
        k, the number of attackers.

    Raises:
        TypeError: ``fraction`` is not a real number or ``num_clients`` not an integer.
        ValueError: ``fraction`` outside ``(0, 1)``, or ``round(fraction N)`` is 0 (a clean
            federation labelled as attacked) or N (no honest client); the message names the
            fraction, N, the count and the fractions that work.

    Example:
        >>> num_attackers(0.3, 20)
        6
        >>> num_attackers(0.01, 4)
        Traceback (most recent call last):
        ...
        ValueError: attack fraction=0.01 with num_clients=4 gives round(0.01 * 4) = 0 attackers; ...
    """
    fraction = _check_fraction(fraction)
    n = check_int(num_clients, "num_clients", 1)
    k = int(round(fraction * n))
    if not 0 < k < n:
        fix = (
            f"choose a fraction in [1/{n}, {n - 1}/{n}] = [{1 / n:.4g}, {(n - 1) / n:.4g}]"
            if n >= 2
            else "an attack needs at least 2 clients"
        )
        raise ValueError(
            f"attack fraction={fraction!r} with num_clients={n} gives round({fraction!r} * {n}) = {k} attackers; "
            f"{'no client would attack' if k == 0 else 'no client would stay honest'}: {fix} "
            "(or attack=None for a run without attackers)."
        )
    return k


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z: ``Phi^{-1}((n - s) / n)``, ``s = floor(n / 2 + 1) - f`` (clamped to >= 1).

    Args:
        n: the number of clients (in the round).
        f: the number of attackers among them.

    Returns:
        z >= 0.

    Raises:
        TypeError: ``n`` or ``f`` is not an integer (``2.5`` is not truncated).
        ValueError: ``n < 1``, ``f`` outside ``[0, n]``, or ``s >= n`` (n = 1, or n = 2 without an
            attacker), where ``Phi^{-1}(0)`` is ``-inf``: no z exists.

    Example:
        >>> round(alie_z(50, 24), 3)  # the paper's example: n = 50, f = 24 -> s = 2
        1.751
    """
    n = check_int(n, "n", 1)
    f = check_int(f, "f", 0, n)
    s = max(1, n // 2 + 1 - f)
    if s >= n:
        raise ValueError(
            f"alie_z(n={n}, f={f}): s = max(1, floor(n / 2 + 1) - f) = {s} is not below n, so "
            "z = Phi^{-1}((n - s) / n) = Phi^{-1}(0) does not exist: ALIE needs n >= 3 clients, or n = 2 with f = 1."
        )
    return NormalDist().inv_cdf((n - s) / n)


def _check_client_ids(client_ids, deltas: Params) -> Tensor:
    """``client_ids`` as a CPU ``Tensor[m]`` of integers, one per row of every ``deltas`` tensor."""
    if not isinstance(client_ids, Tensor):
        try:
            client_ids = torch.as_tensor(client_ids)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"client_ids must be a Tensor[m] of client ids, got {type(client_ids).__name__}.") from None
    if (
        client_ids.dim() != 1
        or client_ids.is_floating_point()
        or client_ids.is_complex()
        or client_ids.dtype == torch.bool
    ):
        raise TypeError(
            f"client_ids must be a 1-d integer Tensor[m], got {client_ids.dtype} of shape {tuple(client_ids.shape)}."
        )
    rows = {k: t.shape[0] if isinstance(t, Tensor) and t.dim() else None for k, t in deltas.items()}
    wrong = {k: r for k, r in rows.items() if r != client_ids.shape[0]}
    if wrong:
        k, r = next(iter(wrong.items()))
        raise ValueError(
            f"client_ids holds {client_ids.shape[0]} ids but deltas[{k!r}] has {r} rows: one id per client's update."
        )
    return client_ids.cpu()


class AttackState(NamedTuple):
    """What an attack carries from round to round (:meth:`Attack.init`, :meth:`Attack.update`).

    Its fields (a NamedTuple's, so not listed again as attributes):

    - ``attackers``: ``Tensor[k]`` (int64) the attacking clients' sorted ids.
    - ``previous``: theta_{t-1} ``{name: Tensor}``, the global model before the last round, for
      the stale free-rider (``None`` for the other kinds, and before round 2); ``simulate``
      checkpoints it.
    """

    attackers: Tensor
    previous: Params | None = None


@dataclass(frozen=True)
class Attack:
    """A fraction of attacking clients and what they do (see the module docstring).

    Attributes:
        kind: one of :data:`ATTACKS`.
        fraction: the share of the N clients that attack, in ``(0, 1)`` (``round(fraction N)``
            clients, which must be at least 1 and at most N - 1: :func:`num_attackers`).
        seed: chooses the attackers (and the Gaussian attack's noise); independent of the run's seed.
        scale: s of ``"sign_flip"`` / ``"scale"``.
        sigma: the standard deviation of ``"gaussian"``.
        target: X of ``"model_replacement"``, ``{name: Tensor}`` shaped like the model (``None``,
            the only value the other kinds take).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: an unknown kind, a fraction outside ``(0, 1)``, a negative sigma, or a
            target missing (``"model_replacement"``) or given to another kind.
    """

    kind: str
    fraction: float = 0.1
    seed: int = 0
    scale: float = 1.0
    sigma: float = 1.0
    target: dict | None = field(default=None, repr=False)

    def __post_init__(self):
        """Check the fields."""
        if self.kind not in ATTACKS:
            raise ValueError(f"kind must be one of {ATTACKS}, got {self.kind!r}.")
        object.__setattr__(self, "fraction", _check_fraction(self.fraction))
        object.__setattr__(self, "seed", check_seed(self.seed))
        object.__setattr__(self, "scale", check_float(self.scale, "scale"))
        object.__setattr__(self, "sigma", check_positive(self.sigma, "sigma", allow_zero=True))
        uses = USES.get(self.kind, ())
        for name, default in _DEFAULTS.items():
            if name not in uses and getattr(self, name) is not default and getattr(self, name) != default:
                users = " or ".join(repr(k) for k, v in USES.items() if name in v)
                shown = "a target" if name == "target" else f"{name}={getattr(self, name)!r}"
                raise ValueError(
                    f"{name} is for kind={users} only, got {shown} with kind={self.kind!r}, which would ignore it "
                    "(leave it out)."
                )
        if self.kind == "model_replacement":
            if not isinstance(self.target, dict) or not all(isinstance(v, Tensor) for v in self.target.values()):
                raise ValueError("kind='model_replacement' needs target={name: Tensor}, the model X to install.")
            bad = [k for k, v in self.target.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
            if bad:
                raise ValueError(f"target holds NaN or Inf (in {bad[:3]}): the model X to install must be finite.")
            object.__setattr__(self, "target", {k: v.detach().clone() for k, v in self.target.items()})

    @property
    def needs_previous(self) -> bool:
        """The attack sends theta_t - theta_{t-1}: the driver must keep the previous global model."""
        return self.kind == "stale_free_rider"

    @property
    def data_level(self) -> bool:
        """The attack changes the attackers' training data (label flipping), not their updates."""
        return self.kind == "label_flip"

    def attackers(self, num_clients: int) -> Tensor:
        """The attacking clients' ids: ``round(fraction N)`` chosen by the attack's seed.

        Args:
            num_clients: N.

        Returns:
            ``Tensor[k]`` (int64) sorted ids.

        Raises:
            ValueError: the fraction gives no attacker or N of them (:func:`num_attackers`).
        """
        k = num_attackers(self.fraction, num_clients)
        g = torch.Generator().manual_seed(derive_seed(self.seed, _TAG_CHOICE))
        return torch.randperm(num_clients, generator=g)[:k].sort().values

    def init(self, num_clients: int, strategy=None) -> AttackState:
        """The attack's state before round 1: its attackers among ``num_clients`` clients.

        Args:
            num_clients: N.
            strategy: the run's strategy; the model-replacement and stale free-rider attacks
                aim at one global model (``strategy.needs.server_model == "one"``).

        Returns:
            ``AttackState(attackers=self.attackers(num_clients), previous=None)``.

        Raises:
            ValueError: an attack on one global model with a strategy that keeps K cluster
                models or none; a fraction that gives no attacker or N of them (:func:`num_attackers`).
        """
        kept = "one" if strategy is None else strategy.needs.server_model
        if self.kind in ("model_replacement", "stale_free_rider") and kept != "one":
            what = "model-replacement" if self.kind == "model_replacement" else "stale free-rider"
            raise ValueError(
                f"The {what} attack aims at one global model; {strategy.name} keeps "
                f"{'K cluster models' if kept == 'clusters' else 'none'}."
            )
        return AttackState(self.attackers(num_clients))

    def poison(self, federation: Federation, state: AttackState) -> Federation:
        """The federation the clients train on: the attackers' labels reversed (``"label_flip"``).

        Args:
            federation: the clients.
            state: the attack's state (:meth:`init`).

        Returns:
            :func:`~fedlearn_edu.data.reverse_labels` of the attackers for the data-level kind,
            else ``federation`` itself.
        """
        return reverse_labels(federation, state.attackers.tolist()) if self.data_level else federation

    def update(
        self,
        deltas: Params,
        client_ids: Tensor,
        state: AttackState,
        round: int,
        server_params: Params | None = None,
        server_lr: float = 1.0,
    ) -> tuple[Params, AttackState]:
        """One round of the attack: the updates the server receives, and the attack's next state.

        :meth:`apply` with the state's attackers and theta_{t-1}; the stale free-rider then keeps
        theta_t for the next round. A data-level attack returns its inputs.

        Args:
            deltas: ``{name: Tensor[m, ...]}`` the round's m honest updates (not modified).
            client_ids: ``Tensor[m]`` their ids.
            state: the attack's state at round t.
            round: t.
            server_params: theta_t (``strategy.server_params(server_state)``).
            server_lr: eta_s (``"model_replacement"``).

        Returns:
            ``(deltas, state)``: the round's updates as the server receives them
            ``{name: Tensor[m, ...]}`` (the input itself when no selected client attacks), and
            the attack's state for round t + 1.

        Raises:
            ValueError: as :meth:`apply`.
        """
        if self.data_level:
            return deltas, state
        out = self.apply(deltas, client_ids, state.attackers, round, server_params, server_lr, state.previous)
        if self.needs_previous:
            state = state._replace(previous={k: v.detach().clone() for k, v in server_params.items()})
        return out, state

    def describe(self) -> str:
        """A one-line description (what ``History.config["attack"]`` records).

        Returns:
            ``"kind(fraction=..., seed=..., ...)"``.
        """
        extra = {"sign_flip": "scale", "scale": "scale", "gaussian": "sigma"}.get(self.kind)
        more = f", {extra}={getattr(self, extra)!r}" if extra else ""
        if self.target is not None:
            more += f", target_norm={float(sum((v.double() ** 2).sum() for v in self.target.values()) ** 0.5):.6g}"
        return f"{self.kind}(fraction={self.fraction!r}, seed={self.seed}{more})"

    def apply(
        self,
        deltas: Params,
        client_ids: Tensor,
        attackers: Tensor,
        round: int,
        server_params: Params | None = None,
        server_lr: float = 1.0,
        previous_params: Params | None = None,
    ) -> Params:
        """The round's updates with the attackers' rows replaced (pure; the input is not modified).

        Args:
            deltas: ``{name: Tensor[m, ...]}`` the honest updates of the round's m clients.
            client_ids: ``Tensor[m]`` their ids.
            attackers: ``Tensor[k]`` the attackers' ids (:meth:`attackers`).
            round: t (seeds the Gaussian attack).
            server_params: theta_t (``"model_replacement"`` and ``"stale_free_rider"``).
            server_lr: eta_s (``"model_replacement"`` only).
            previous_params: theta_{t-1} (``"stale_free_rider"``; ``None`` in round 1: a zero update).

        Returns:
            ``{name: Tensor[m, ...]}``; the same object when no selected client attacks or the
            attack is data-level.

        Raises:
            ValueError: ``"model_replacement"`` or ``"stale_free_rider"`` (after round 1) without a
                server model, or a target of another shape.
        """
        ids = _check_client_ids(client_ids, deltas)
        bad = torch.isin(ids, attackers.cpu())
        if self.data_level or not bool(bad.any()):
            return deltas
        m = ids.shape[0]
        rows = bad.nonzero().flatten()
        out = {}
        if self.kind == "model_replacement":
            if server_params is None:
                raise ValueError("The model-replacement attack needs a strategy with one global model.")
            missing = sorted(set(deltas) - set(self.target))
            if missing:
                raise ValueError(f"The model-replacement target lacks the parameters {missing[:5]}.")
        if self.kind == "stale_free_rider" and previous_params is not None and server_params is None:
            raise ValueError("The stale free-rider attack needs a strategy with one global model.")
        for k, t in deltas.items():
            r = rows.to(t.device)
            new = t.clone()
            if self.kind == "sign_flip":
                new[r] = -self.scale * t[r]
            elif self.kind == "scale":
                new[r] = self.scale * t[r]
            elif self.kind == "free_rider" or (self.kind == "stale_free_rider" and previous_params is None):
                new[r] = 0
            elif self.kind == "stale_free_rider":
                step = server_params[k].to(t.dtype) - previous_params[k].to(device=t.device, dtype=t.dtype)
                new[r] = step.expand_as(t[r])
            elif self.kind == "gaussian":
                for j in rows.tolist():
                    g = torch.Generator().manual_seed(derive_seed(self.seed, round, int(ids[j]), _TAG_NOISE))
                    noise = torch.randn(t.shape[1:], generator=g, dtype=torch.float64)
                    new[j] = (self.sigma * noise).to(device=t.device, dtype=t.dtype)
            elif self.kind == "alie":
                honest = t[(~bad).to(t.device)]
                if honest.shape[0] == 0:
                    sent = t[r]  # no honest update to imitate: the attackers keep theirs
                else:
                    h = honest.double()
                    z = alie_z(m, int(bad.sum()))
                    sent = (h.mean(0) - z * h.std(0, correction=0)).to(t.dtype).expand_as(t[r])
                new[r] = sent
            elif self.kind == "model_replacement":
                x = self.target[k].to(device=t.device, dtype=t.dtype)
                if tuple(x.shape) != tuple(t.shape[1:]):
                    raise ValueError(
                        f"The model-replacement target's {k!r} is {tuple(x.shape)}, the model's {tuple(t.shape[1:])}."
                    )
                new[r] = ((m / server_lr) * (x - server_params[k].to(t.dtype))).expand_as(t[r])
            if new.is_floating_point() and not bool(torch.isfinite(new[r]).all()) and bool(torch.isfinite(t[r]).all()):
                raise FloatingPointError(self._nonfinite_message(round, k, t.dtype, server_lr))
            out[k] = new
        return out

    def _nonfinite_message(self, round, key: str, dtype, server_lr) -> str:
        """The attack itself made finite updates NaN/Inf: blame its own argument, not local training."""
        culprit = {
            "sign_flip": f"scale={self.scale!r}",
            "scale": f"scale={self.scale!r}",
            "gaussian": f"sigma={self.sigma!r}",
            "model_replacement": f"target (or server_lr={server_lr!r}, which divides it)",
        }.get(self.kind, "its settings")
        return (
            f"Round {round}: the {self.kind} attack made the attackers' updates of {key!r} NaN/Inf (beyond "
            f"{dtype}): lower the attack's {culprit}; local training was not at fault."
        )

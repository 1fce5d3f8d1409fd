"""The grid's federations: :class:`FederationSpec` and :func:`parse_federation`'s short strings."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_instance, check_int, check_name, check_path, check_positive, check_range

# The attack's parameters a federation string's attack gets (recorded in the run's key): the
# scaling attack multiplies by 10, the Gaussian one sends N(0, 1) per coordinate; the rest use
# :class:`~fedlearn_edu.attacks.Attack`'s defaults.
ATTACK_SETTINGS = {"scale": {"scale": 10.0}, "gaussian": {"sigma": 1.0}}


@dataclass(frozen=True)
class FederationSpec:
    """One federation of the grid (built anew for every seed).

    Args:
        name: the label in the records (e.g. ``"dirichlet:0.1"``).
        dataset: a name :func:`~fedlearn_edu.data.load_dataset` accepts.
        partition: ``"iid"``, ``"dirichlet"``, ``"shards"`` or ``"quantity"``; or ``"clusters"``:
            ``num_clusters`` clusters of ``num_clients / num_clusters`` clients each whose data
            differ by ``shift`` (:func:`~fedlearn_edu.data.shifted_federation`, with
            ``num_samples // num_clients`` samples per client when ``num_samples`` is given).
        partition_params: ``alpha`` / ``shards_per_client`` / ``sigma`` / ``min_size``; for
            ``"clusters"``: ``num_clusters`` and ``shift`` (``"label"``, ``"concept"`` ...).
        num_clients: N.
        model: a name :func:`~fedlearn_edu.make_model` accepts.
        noisy_clients: share of the clients whose training labels are flipped (0: none).
        noise_fraction: share of a noisy client's training labels flipped.
        num_samples: keep a random subset of this many samples (quick runs).
        attack: a kind of :data:`fedlearn_edu.attacks.ATTACKS` (``""``: no attacker).
        attack_fraction: the share of the clients that attack (chosen by the run's seed).
        attack_params: the :class:`~fedlearn_edu.attacks.Attack`'s other fields (``scale``,
            ``sigma``).
        root: the dataset folder (not part of the run's key).

    Raises:
        TypeError: a field of the wrong type (a name that is not a string, a count that is not
            an integer, a share that is not a real number, parameters that are not a mapping, a
            ``root`` that is not a path).
        ValueError: an unknown dataset, model, partition or attack; ``partition_params`` the
            partition does not take or out of range (as :func:`parse_federation` checks them);
            ``num_samples`` below ``num_clients``; an ``attack_fraction`` that rounds to no
            attacker or to every client; ``attack_params`` that set the seed, kind or fraction.
    """

    name: str
    dataset: str = "digits"
    partition: str = "dirichlet"
    partition_params: Mapping = field(default_factory=dict)
    num_clients: int = 20
    model: str = "mlp"
    noisy_clients: float = 0.0
    noise_fraction: float = 0.0
    num_samples: int | None = None
    attack: str = ""
    attack_fraction: float = 0.0
    attack_params: Mapping = field(default_factory=dict)
    root: str | None = field(default=None, compare=False)

    def __post_init__(self):
        from ..data import PARTITIONS

        check_name(self.name, "FederationSpec name", "dirichlet:0.1")
        _check_names(self.dataset, self.model)
        check_instance(self.partition, "partition", str, "a partition's name such as 'dirichlet'")
        if self.partition not in PARTITIONS and self.partition != CLUSTERS:
            raise ValueError(f"Unknown partition {self.partition!r}; choose one of {[*PARTITIONS, CLUSTERS]}.")
        # numbers the run's key hashes: Python's or NumPy's (a tensor would not go into its JSON)
        for what in ("num_clients", "num_samples"):
            if getattr(self, what) is not None:
                check_instance(getattr(self, what), what, (int, np.integer), "an integer")
        check_int(self.num_clients, "num_clients", 2)
        if self.num_samples is not None:
            check_int(self.num_samples, "num_samples", self.num_clients)
        for what in ("noisy_clients", "noise_fraction", "attack_fraction"):
            check_instance(getattr(self, what), what, _REAL, "a real number")
        check_range(self.noisy_clients, "noisy_clients", 0.0, 1.0)
        check_range(self.noise_fraction, "noise_fraction", 0.0, 1.0)
        for what in ("partition_params", "attack_params"):
            check_instance(getattr(self, what), what, Mapping, "a mapping {name: value}")
        if self.root is not None:
            check_path(self.root, "root", "a folder's path or None")
        object.__setattr__(self, "partition_params", dict(self.partition_params))
        object.__setattr__(self, "attack_params", dict(self.attack_params))
        if self.partition == CLUSTERS:
            _check_clusters(self.partition_params, self.num_clients)
        else:
            _check_partition_params(self.partition, self.partition_params)
        check_instance(self.attack, "attack", str, "a kind such as 'sign_flip' or '' (none)")
        if self.attack:
            from ..attacks import ATTACKS, Attack, num_attackers

            if self.attack not in ATTACKS or self.attack == "model_replacement":
                kinds = [k for k in ATTACKS if k != "model_replacement"]
                raise ValueError(f"attack must be one of {kinds} (or ''), got {self.attack!r}.")
            check_range(self.attack_fraction, "attack_fraction", 0.0, 1.0, low_open=True, high_open=True)
            try:  # round(fraction N) attackers: refused when that is none or every client
                num_attackers(self.attack_fraction, self.num_clients)
            except ValueError as err:
                raise ValueError(f"attack_fraction ({self.attack}): {err}") from None
            fixed = sorted(set(self.attack_params) & {"kind", "fraction", "seed", "target"})
            if fixed:
                raise ValueError(
                    f"attack_params may not set {fixed}: the kind and fraction are the spec's, the attackers are "
                    f"drawn with the run's seed; got {self.attack_params!r}."
                )
            try:
                Attack(self.attack, self.attack_fraction, **self.attack_params)  # the parameters are valid
            except (TypeError, ValueError) as err:  # an unknown field, or a value Attack refuses
                known = [
                    f.name for f in dataclasses.fields(Attack) if f.name not in ("kind", "fraction", "seed", "target")
                ]
                raise ValueError(f"attack_params takes {known}; got {self.attack_params!r} ({err})") from None
        elif not _is_zero(self.attack_fraction) or self.attack_params:
            raise ValueError("attack_fraction and attack_params need an attack kind (attack='sign_flip', ...).")

    def config(self) -> dict:
        """The settings that define the federation (the run key hashes them).

        Without an attacker the attack fields are left out, so that the keys of federations
        without one are those of the records written before the fields existed.
        """
        d = dataclasses.asdict(self)
        d.pop("root")
        if not self.attack:
            for name in ("attack", "attack_fraction", "attack_params"):
                d.pop(name)
        return d


_REAL = (int, float, np.integer, np.floating)  # a real number (check_range refuses bools)
_PARAM = {"dirichlet": "alpha", "shards": "shards_per_client", "quantity": "sigma"}
# A federation of clusters: K groups of clients whose data differ by a shift (label shift, where
# client-conditional FL's fingerprints see the clusters; chapter *One model, many clients*).
CLUSTERS = "clusters"
CLUSTER_SHIFT = "label"


def _check_names(dataset, model) -> None:
    """Raise unless ``dataset`` and ``model`` are names the package knows (no file is read)."""
    from ..data.datasets import dataset_info
    from ..models import MODELS

    for what, value in (("dataset", dataset), ("model", model)):
        check_instance(value, what, str, f"a name such as {'digits' if what == 'dataset' else 'mlp'!r}")
    dataset_info(dataset)  # "Unknown dataset ..."
    if model.lower().replace("-", "").replace("_", "") not in MODELS:
        raise ValueError(f"Unknown model {model!r}; choose one of {sorted(MODELS)}.")


# The partition_params each partition takes: a positive number, or a positive / non-negative integer.
_PARTITION_PARAMS = {
    "iid": {},
    "dirichlet": {"alpha": "positive", "min_size": "count"},
    "shards": {"shards_per_client": "integer"},
    "quantity": {"sigma": "positive", "min_size": "count"},
}


def _check_partition_params(partition: str, params: Mapping) -> None:
    """Raise unless ``params`` are keys ``partition`` takes, with valid values (as :func:`parse_federation`'s)."""
    allowed = _PARTITION_PARAMS.get(partition, {})
    unknown = sorted(set(params) - set(allowed), key=str)
    if unknown:
        raise ValueError(
            f"partition_params of a {partition!r} partition take {sorted(allowed)}; got unknown {unknown} "
            f"in {params!r}."
        )
    for key, value in params.items():
        name = f"partition_params[{key!r}]"
        if allowed[key] == "positive":
            check_positive(value, name)
        else:
            check_int(value, name, 1 if allowed[key] == "integer" else 0)


def _is_zero(value) -> bool:
    """``value`` is the number 0 (not ``False``, ``None`` or an empty container)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and value == 0


def _check_clusters(params: Mapping, num_clients: int) -> None:
    """Raise ValueError unless ``params`` define K >= 2 equal clusters of ``num_clients`` and a known shift."""
    from ..data.shifts import parse_shift

    if set(params) != {"num_clusters", "shift"}:
        raise ValueError(f"partition='{CLUSTERS}' takes partition_params num_clusters and shift, got {params!r}.")
    k = params["num_clusters"]
    check_instance(k, "num_clusters", int, "an integer >= 2")
    check_int(k, "num_clusters", 2)
    if num_clients % k:
        raise ValueError(f"{num_clients} clients cannot form {k} clusters of equal size; use a divisor of num_clients.")
    check_instance(params["shift"], "shift", str, "a shift's name such as 'label' or 'concept'")
    if not parse_shift(params["shift"]):
        raise ValueError(f"shift must name a shift such as 'label' or 'concept', got {params['shift']!r}.")


def parse_federation(text, **common) -> FederationSpec:
    """A :class:`FederationSpec` from a short string.

    ``"iid"``, ``"dirichlet:ALPHA"``, ``"shards:PER_CLIENT"``, ``"quantity:SIGMA"`` (log-normal
    client sizes, IID labels), or ``"noisy:FRACTION"``: Dirichlet alpha = 1 where 30 % of the
    clients have ``FRACTION`` of their training labels flipped (test labels stay clean), or
    ``"clusters:K"``: K clusters of equally many clients that differ by a label shift (each cluster
    its own classes, :func:`~fedlearn_edu.data.shifted_federation`; drawn by the run's seed).
    ``"+KIND:FRACTION"`` after any of them adds attackers: that share of the clients attacks
    with ``KIND`` of :data:`fedlearn_edu.attacks.ATTACKS` (``"dirichlet:0.5+sign_flip:0.3"``),
    with the parameters :data:`ATTACK_SETTINGS` gives the kind.

    Args:
        text: the string (or a FederationSpec, returned with ``common`` applied).
        common: other FederationSpec fields (``dataset``, ``num_clients``, ``model`` ...).
    """
    if isinstance(text, FederationSpec):
        return dataclasses.replace(text, **common) if common else text
    if not isinstance(text, str):
        raise TypeError(f"A federation is a string like 'dirichlet:0.1' or a FederationSpec, got {text!r}.")
    if "+" in text:
        base, _, attack = text.strip().partition("+")
        kind, _, value = attack.strip().partition(":")
        kind = kind.strip().lower()
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(
                f"Federation {text!r}: the attack is KIND:FRACTION, e.g. 'sign_flip:0.3'; got {attack!r}."
            ) from None
        spec = parse_federation(base, **common)
        return dataclasses.replace(
            spec,
            name=f"{spec.name}+{kind}:{fraction!r}",  # one spelling: the run key hashes the name
            attack=kind,
            attack_fraction=fraction,
            attack_params=dict(ATTACK_SETTINGS.get(kind, {})),
        )
    kind, _, value = text.strip().partition(":")
    kind = kind.lower()
    try:
        number = float(value) if value else None
    except ValueError:
        raise ValueError(f"Federation {text!r}: {value!r} is not a number.") from None
    if number is not None and (not math.isfinite(number) or number <= 0):
        raise ValueError(f"Federation {text!r}: the parameter must be a positive number.")
    if kind == "iid":
        if value:
            raise ValueError(f"Federation {text!r}: 'iid' takes no parameter.")
        return FederationSpec("iid", partition="iid", **common)
    # the name is the canonical spelling (lower-case kind, the number as Python writes it: 'DIRICHLET:.50'
    # is 'dirichlet:0.5'), so that one federation has one run key however it was typed
    if kind in _PARAM:
        if number is None:
            raise ValueError(f"Federation {text!r}: give the parameter, e.g. '{kind}:1'.")
        param = int(number) if kind == "shards" else number
        if kind == "shards" and param != number:
            raise ValueError(f"Federation {text!r}: shards per client must be an integer.")
        name = f"{kind}:{param!r}"
        return FederationSpec(name, partition=kind, partition_params={_PARAM[kind]: param}, **common)
    if kind == "noisy":
        if number is None or number > 1:
            raise ValueError(f"Federation {text!r}: give the flipped share in (0, 1], e.g. 'noisy:0.8'.")
        return FederationSpec(
            f"noisy:{number!r}",
            partition="dirichlet",
            partition_params={"alpha": 1.0},
            noisy_clients=0.3,
            noise_fraction=number,
            **common,
        )
    if kind == CLUSTERS:
        if number is None or number != int(number) or number < 2:
            raise ValueError(f"Federation {text!r}: give the number of clusters, an integer >= 2, e.g. 'clusters:4'.")
        params = {"num_clusters": int(number), "shift": CLUSTER_SHIFT}
        return FederationSpec(f"{CLUSTERS}:{int(number)}", partition=CLUSTERS, partition_params=params, **common)
    raise ValueError(
        f"Unknown federation {text!r}; use iid, dirichlet:ALPHA, shards:PER_CLIENT, quantity:SIGMA, noisy:FRACTION "
        "or clusters:K."
    )

"""Client-conditional FL: one global model with a second input, the client's fingerprint.

Brännvall (2026): every client i computes, once and locally, a fingerprint
``s_i`` of its training data (:func:`fedlearn_edu.signals.pca_fingerprint`);
one global model takes ``s_i`` as a second input, concatenated to the
backbone's features *before* its fully connected layers; clients train this
model with FedAvg, each feeding its own ``s_i``; ``s_i`` never leaves the
client.

How the package carries ``s_i`` without touching the engines or the simulator
(**ours**): :func:`condition_federation` stores every client's inputs
*flattened, with the client's own condition vector appended*,

    x_packed = [ flatten(x) , s_i ]        Tensor[n, D + c]

in that client's own :class:`~fedlearn_edu.data.ClientData` (train and test
split). The unchanged engines, :func:`~fedlearn_edu.simulate` and
:func:`~fedlearn_edu.evaluate_clients` move each client's tensors only to the
computation of that client, so ``s_i`` travels with the client's data, exactly
like the data never reaches the server: the server receives model updates
only. :class:`ConditionalModel` splits the packed input again
(:func:`split_condition`), runs the backbone's feature extractor on
``x``, concatenates ``s_i`` to the features and runs the fully connected head.

The Oracle baseline is the same model fed a one-hot cluster id instead of
``s_i`` (:func:`oracle_federation`).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_bool, check_int
from .data.federation import ClientData, Federation
from .data.shifts import cluster_ids
from .models import count_parameters, make_model
from .personalization import simulate_ditto, simulate_ifca, simulate_local
from .signals.fingerprint import client_fingerprints
from .simulation import History, simulate
from .strategies.decentralized import DAC, Gossip
from .strategies.fedavg import FedAvg
from .utils import derive_seed

__all__ = [
    "ConditionalModel",
    "make_conditional_model",
    "parameter_overhead",
    "pack_condition",
    "split_condition",
    "condition_federation",
    "fingerprint_federation",
    "oracle_federation",
    "client_conditions",
    "CONDITION_TRANSFORMS",
    "METHODS",
    "compare_methods",
]


# --------------------------------------------------------------------------- #
# packing: the condition rides along with each client's own inputs
# --------------------------------------------------------------------------- #
def pack_condition(x: Tensor, condition: Tensor) -> Tensor:
    """``[flatten(x), condition]``: ``Tensor[n, ...]`` and ``Tensor[c]`` -> ``Tensor[n, D + c]``.

    Args:
        x: ``Tensor[n, ...]`` inputs.
        condition: ``Tensor[c]``, one client's condition vector.

    Returns:
        ``Tensor[n, D + c]``, ``D`` the size of one flattened input.

    Example:
        >>> pack_condition(torch.zeros(3, 1, 2, 2), torch.tensor([1.0, 2.0])).shape
        torch.Size([3, 6])
    """
    cond = torch.as_tensor(condition, dtype=x.dtype, device=x.device)
    if cond.dim() != 1:
        raise ValueError(f"condition must be one vector Tensor[c] per client; got shape {tuple(cond.shape)}.")
    flat = x.reshape(x.shape[0], -1)
    return torch.cat([flat, cond.unsqueeze(0).expand(x.shape[0], -1)], dim=1)


def split_condition(packed: Tensor, input_shape: Sequence[int], cond_dim: int) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`pack_condition`: ``Tensor[B, D + c]`` -> ``(Tensor[B, *input_shape], Tensor[B, c])``.

    Args:
        packed: ``Tensor[B, D + c]``.
        input_shape: the shape of one input, ``D = prod(input_shape)``.
        cond_dim: ``c``.

    Returns:
        ``(x: Tensor[B, *input_shape], cond: Tensor[B, c])``.
    """
    d = math.prod(input_shape)
    if packed.dim() != 2 or packed.shape[1] != d + cond_dim:
        raise ValueError(
            f"A conditional model expects packed inputs Tensor[B, {d} + {cond_dim}] (flattened input of shape "
            f"{tuple(input_shape)} followed by the condition); got {tuple(packed.shape)}. "
            "Build the federation with condition_federation / fingerprint_federation, or pass cond=."
        )
    return packed[:, :d].reshape(packed.shape[0], *input_shape), packed[:, d:]


CONDITION_TRANSFORMS = (None, "log", "standardize")


def _transform(cond: Tensor, transform) -> Tensor:
    if transform is None:
        return cond
    if callable(transform):
        return transform(cond)
    if transform == "log":
        return torch.log(cond.clamp(min=0) + 1e-4)
    if transform == "standardize":
        # per client, over the entries of its own vector: needs nothing from other clients
        return (cond - cond.mean()) / cond.std().clamp(min=1e-12)
    raise ValueError(
        f"Unknown condition transform {transform!r}; choose one of {CONDITION_TRANSFORMS} or pass a callable."
    )


def condition_federation(
    federation: Federation, conditions: Tensor, *, transform=None, kind: str = "condition"
) -> Federation:
    """A copy of ``federation`` whose client i stores ``[flatten(x), conditions[i]]`` as inputs.

    Args:
        federation: the clients.
        conditions: ``Tensor[N, c]``, row i computed by (and known only to) client i.
        transform: applied to each row before packing, locally: ``None``, ``"log"``
            (``log(s + 1e-4)``) or ``"standardize"`` (the row's own mean and std), or a callable.
        kind: a label recorded in ``client.info["condition"]``.

    Returns:
        A :class:`Federation` with inputs ``Tensor[n_i, D + c]``; each client's ``info`` gains
        ``input_shape`` (the original shape) and ``condition_dim``.
    """
    cond = torch.as_tensor(conditions)
    if cond.dim() != 2 or cond.shape[0] != len(federation):
        raise ValueError(
            f"conditions must be Tensor[N, c] with N = {len(federation)} clients; got {tuple(cond.shape)}."
        )
    if not bool(torch.isfinite(cond).all()):
        raise ValueError("conditions contain NaN or Inf.")
    shape = federation.input_shape
    clients = []
    for i, c in enumerate(federation):
        row = _transform(cond[i].to(c.train_x.dtype if c.train_x.is_floating_point() else torch.float32), transform)
        info = {**c.info, "input_shape": tuple(shape), "condition_dim": int(row.numel()), "condition": kind}
        clients.append(
            ClientData(
                pack_condition(c.train_x.float(), row), c.train_y, pack_condition(c.test_x.float(), row), c.test_y, info
            )
        )
    return Federation(clients, federation.num_classes, f"{federation.name} [+{kind}]")


def client_conditions(federation: Federation) -> Tensor:
    """Read back each client's packed condition vector (``Tensor[N, c]``) -- for plots and checks.

    Args:
        federation: a federation built by :func:`condition_federation`.

    Returns:
        ``Tensor[N, c]``, row i client i's condition.

    Raises:
        ValueError: the federation carries no conditions.
    """
    c = federation[0].info.get("condition_dim")
    if c is None:
        raise ValueError("This federation carries no conditions; build it with condition_federation.")
    return torch.stack([cl.train_x[0, -c:] for cl in federation])


def fingerprint_federation(
    federation: Federation,
    num_eigenvalues: int = 32,
    normalize="trace",
    *,
    feature_map="flatten",
    label_encoding="onehot",
    label_scale: float = 1.0,
    reference: Tensor | None = None,
    transform=None,
) -> Federation:
    """Each client computes its fingerprint from its training split and appends it to its inputs.

    Arguments as in :func:`fedlearn_edu.signals.pca_fingerprint` and :func:`condition_federation`;
    with ``reference`` (a public fingerprint, see
    :func:`fedlearn_edu.signals.reference_fingerprint`) each client packs ``s_i - reference``.

    Args:
        federation: the clients (not modified).
        num_eigenvalues: ``l``, the fingerprint's length.
        normalize: how the spectrum is normalised (see :func:`~fedlearn_edu.signals.pca_fingerprint`).
        feature_map: the feature map applied to the inputs first.
        label_encoding: how the labels join the features.
        label_scale: the weight of the label block, >= 0.
        reference: ``Tensor[l]`` public fingerprint subtracted from every client's, or ``None``.
        transform: applied to each row before packing (see :func:`condition_federation`).

    Returns:
        A :class:`Federation` with inputs ``Tensor[n_i, D + l]``.

    Raises:
        ValueError: ``reference`` of another length.

    Example:
        >>> from fedlearn_edu.data import shifted_federation
        >>> fed = fingerprint_federation(shifted_federation("digits", "label", 2, 2), num_eigenvalues=8)
        >>> fed.input_shape
        (72,)
    """
    s = client_fingerprints(
        federation,
        num_eigenvalues,
        normalize,
        feature_map=feature_map,
        label_encoding=label_encoding,
        label_scale=label_scale,
    )
    if reference is not None:
        ref = torch.as_tensor(reference, dtype=s.dtype)
        if ref.shape != s.shape[1:]:
            raise ValueError(f"reference must be Tensor[{s.shape[1]}] like the fingerprints; got {tuple(ref.shape)}.")
        s = s - ref
    return condition_federation(federation, s.float(), transform=transform, kind="fingerprint")


def oracle_federation(federation: Federation) -> Federation:
    """Each client appends the one-hot code of its true cluster (``client.info["cluster"]``): the Oracle.

    Args:
        federation: clients with ``info["cluster"]`` (not modified).

    Returns:
        A :class:`Federation` with inputs ``Tensor[n_i, D + K]``, K the number of clusters.
    """
    ids = torch.as_tensor(cluster_ids(federation))
    return condition_federation(federation, F.one_hot(ids).float(), kind="oracle")


# --------------------------------------------------------------------------- #
# the conditional model
# --------------------------------------------------------------------------- #
def _get(module: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _set(module: nn.Module, dotted: str, value: nn.Module) -> None:
    *path, last = dotted.split(".")
    for part in path:
        module = getattr(module, part)
    setattr(module, last, value)


class ConditionalModel(nn.Module):
    """A package backbone whose features are concatenated with a condition vector before the FC layers.

    Where the condition enters (the first fully connected layer after the feature
    extractor gains ``cond_dim`` input columns, nothing else changes):

    ============  =======================================================================
    backbone      the layer that receives ``[features, condition]``
    ============  =======================================================================
    ``CNN``       ``fc1`` (after the two conv/pool stages), as in the paper
    ``SmallCNN``  ``fc1``
    ``MLP``       the last hidden layer (the earlier hidden layers are the "features")
    ``ResNet20``  ``out``, the only FC layer: the condition then only shifts the logits
    ============  =======================================================================

    The new columns start at zero (``zero_init=True``), so at initialisation the model
    computes exactly what the backbone computes, whatever the condition.

    Args:
        backbone: an ``MLP``, ``CNN``, ``SmallCNN`` or ``ResNet20`` (copied, not modified).
        input_shape: shape of one input of the backbone, e.g. ``(1, 8, 8)``.
        cond_dim: length c of the condition vector (``l`` for fingerprints, K for the Oracle).
        cond_scale: the condition is multiplied by this before concatenation.
        zero_init: start the condition columns at zero (else PyTorch's default init).

    Inputs:
        ``model(x)`` with packed ``x: Tensor[B, D + c]`` (see :func:`pack_condition`), or
        ``model(x, cond)`` with ``x: Tensor[B, *input_shape]`` and ``cond: Tensor[B, c]``.
        ``features=True`` returns the backbone's usual penultimate pre-activations.

    Example:
        >>> m = ConditionalModel(make_model("cnn", (1, 28, 28), 10), (1, 28, 28), cond_dim=32)
        >>> m(torch.zeros(2, 1, 28, 28), torch.zeros(2, 32)).shape
        torch.Size([2, 10])
        >>> round(parameter_overhead(m), 4)
        0.0089
    """

    def __init__(
        self,
        backbone: nn.Module,
        input_shape: Sequence[int],
        cond_dim: int,
        cond_scale: float = 1.0,
        zero_init: bool = True,
    ):
        zero_init = check_bool(zero_init, "zero_init")
        super().__init__()
        if not all(hasattr(backbone, a) for a in ("features", "head", "head_layer")):
            raise TypeError(
                "ConditionalModel supports the package backbones (MLP, CNN, SmallCNN, ResNet20) and any model "
                f"that owns its split: features(x), head(z, features), head_layer; got {type(backbone).__name__}."
            )
        check_int(cond_dim, "cond_dim", 1)
        self.input_shape = tuple(int(s) for s in input_shape)
        self.cond_dim = int(cond_dim)
        self.cond_scale = float(cond_scale)
        self.backbone = copy.deepcopy(backbone)
        self.backbone_parameters = count_parameters(backbone)
        self.cond_layer = self.backbone.head_layer
        old = _get(self.backbone, self.cond_layer)
        new = nn.Linear(
            old.in_features + self.cond_dim, old.out_features, device=old.weight.device, dtype=old.weight.dtype
        )
        with torch.no_grad():
            if zero_init:
                new.weight[:, old.in_features :] = 0.0
            new.weight[:, : old.in_features] = old.weight
            new.bias.copy_(old.bias)
        _set(self.backbone, self.cond_layer, new)

    def forward(self, x: Tensor, cond: Tensor | None = None, features: bool = False) -> Tensor:
        """Logits of the backbone with the condition joined at ``cond_layer``.

        Args:
            x: ``Tensor[batch, D + c]`` inputs with the condition packed at the end
                (:func:`pack_condition`), or ``Tensor[batch, *input_shape]`` with ``cond``.
            cond: ``Tensor[batch, c]`` conditions (default: unpacked from ``x``).
            features: return the head's pre-activations (the penultimate layer) instead.

        Returns:
            ``Tensor[batch, num_classes]`` logits (or the features).

        Raises:
            ValueError: ``cond`` does not have ``cond_dim`` entries per sample.
        """
        if cond is None:
            x, cond = split_condition(x, self.input_shape, self.cond_dim)
        elif cond.shape[-1] != self.cond_dim:
            raise ValueError(f"cond must have {self.cond_dim} entries per sample, got {cond.shape[-1]}.")
        z = self.backbone.features(x)
        if features and self.cond_layer == "out":  # the head is the output layer alone: z is the penultimate
            return z
        return self.backbone.head(torch.cat([z, self.cond_scale * cond.to(z.dtype)], dim=1), features)

    def extra_repr(self) -> str:
        """The condition's settings, shown in ``repr(model)``."""
        return f"cond_dim={self.cond_dim}, cond_layer={self.cond_layer!r}, cond_scale={self.cond_scale}"


def parameter_overhead(model: ConditionalModel) -> float:
    """Extra parameters of a conditional model relative to its backbone: ``(P_cond - P) / P``.

    Args:
        model: a :class:`ConditionalModel`.

    Returns:
        The relative overhead, e.g. ``0.02`` for 2 % more parameters.
    """
    return (count_parameters(model) - model.backbone_parameters) / model.backbone_parameters


def make_conditional_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    cond_dim: int,
    *,
    seed: int | None = 0,
    cond_scale: float = 1.0,
    zero_init: bool = True,
    **kwargs,
) -> ConditionalModel:
    """:func:`~fedlearn_edu.make_model` wrapped in a :class:`ConditionalModel` (same seed, same backbone weights).

    Args:
        name: a backbone of :func:`~fedlearn_edu.make_model` (``"mlp"``, ``"cnn"``, ``"smallcnn"``, ``"resnet20"``).
        input_shape: the shape of one input (without the condition).
        num_classes: number of classes.
        cond_dim: ``c``, the condition's length.
        seed: seeds the backbone (``None``: the global RNG).
        cond_scale: the condition's multiplier inside the model.
        zero_init: start the condition's weights at zero, so the model starts as its backbone.
        **kwargs: passed to :func:`~fedlearn_edu.make_model` (e.g. ``hidden``).

    Returns:
        The :class:`ConditionalModel`.

    Example:
        >>> m = make_conditional_model("mlp", (1, 8, 8), 10, cond_dim=32)
        >>> m(torch.zeros(4, 64 + 32)).shape
        torch.Size([4, 10])
    """
    backbone = make_model(name, input_shape, num_classes, seed=seed, **kwargs)
    if seed is None:
        return ConditionalModel(backbone, input_shape, cond_dim, cond_scale=cond_scale, zero_init=zero_init)
    # The widened layer's fresh weights come from a generator seeded here (the global RNG is
    # neither read nor advanced): the same seed gives the same model, zero_init or not.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, 0xC0D17))
        return ConditionalModel(backbone, input_shape, cond_dim, cond_scale=cond_scale, zero_init=zero_init)


# --------------------------------------------------------------------------- #
# the chapter's comparison in one call
# --------------------------------------------------------------------------- #
METHODS = ("fedavg", "local", "ifca", "ditto", "oracle", "conditional")
DECENTRALISED_METHODS = ("gossip", "dac")  # accepted by compare_methods on request, not run by default


def _keeps_global_rng(fn):
    """Run ``fn`` in a forked RNG: seeded runs leave the caller's global RNG as it was."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.random.fork_rng(devices=[]):
            return fn(*args, **kwargs)

    return wrapper


@_keeps_global_rng
def compare_methods(
    federation: Federation,
    methods: Sequence[str] = METHODS,
    *,
    model: str = "mlp",
    model_kwargs: dict | None = None,
    num_eigenvalues: int = 32,
    fingerprint_kwargs: dict | None = None,
    reference: Tensor | None = None,
    cond_scale: float | None = None,
    oracle_scale: float = 5.0,
    num_clusters: int | None = None,
    ditto_lam: float = 0.1,
    ditto_strategy=None,
    num_neighbours: int = 3,
    **train,
) -> dict:
    """Run FedAvg, local-only, IFCA, Ditto, the Oracle and the conditional model on one federation.

    Every method uses the same backbone (``make_model(model, ..., seed=train['seed'])``), the
    same rounds, client sampling and local SGD (``train``: the keyword arguments of
    :func:`~fedlearn_edu.simulate`), and is scored the same way: per-client accuracy, on
    the client's own test split, of the model that client would use.

    ================ ===================================================================
    ``fedavg``       :func:`~fedlearn_edu.simulate` with :class:`~fedlearn_edu.FedAvg`
    ``local``        :func:`~fedlearn_edu.personalization.simulate_local`
    ``ifca``         :func:`~fedlearn_edu.personalization.simulate_ifca` with K = ``num_clusters``
                     (default: the true number of clusters)
    ``ditto``        :func:`~fedlearn_edu.personalization.simulate_ditto` (``ditto_lam``,
                     ``ditto_strategy``: the global aggregator, FedAvg by default)
    ``oracle``       the conditional model fed the one-hot true cluster (x ``oracle_scale``)
    ``conditional``  the conditional model fed each client's fingerprint (minus ``reference``
                     when given) x ``cond_scale``; ``cond_scale=None`` picks 20 with a
                     reference and 2.5 without (so the condition has a norm of order 1).
    ``gossip``       (on request) :class:`~fedlearn_edu.Gossip` with ``num_neighbours`` sampled
                     neighbours per round, averaged by data size (Zec et al.'s "Random")
    ``dac``          (on request) :class:`~fedlearn_edu.DAC` with ``num_neighbours``
    ================ ===================================================================

    Args:
        federation: clients with ``info["cluster"]`` (e.g. from :func:`~fedlearn_edu.data.shifted_federation`).
        methods: names from the table (default: the six above, without gossip and dac).
        model: the backbone's name for :func:`~fedlearn_edu.make_model`.
        model_kwargs: passed to :func:`~fedlearn_edu.make_model`.
        num_eigenvalues: the fingerprint's length (``conditional``).
        fingerprint_kwargs: passed to :func:`fingerprint_federation`.
        reference: public fingerprint ``Tensor[num_eigenvalues]`` subtracted by every client.
        cond_scale: the fingerprint's multiplier (see the table).
        oracle_scale: the Oracle's one-hot multiplier.
        num_clusters: IFCA's K (default: the true number of clusters).
        ditto_lam: Ditto's lambda.
        ditto_strategy: Ditto's global strategy (default FedAvg).
        num_neighbours: neighbours per round for gossip and dac.
        **train: keyword arguments of :func:`~fedlearn_edu.simulate` (``rounds``, ``seed``, ...);
            ``clients_per_round`` defaults to every client, ``progress`` to ``False``.

    Raises:
        ValueError: an unknown method.

    Returns:
        ``{method: History}`` in the order of ``methods``.
    """
    unknown = [m for m in methods if m not in METHODS + DECENTRALISED_METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from {METHODS + DECENTRALISED_METHODS}.")
    train = dict(train)
    train.setdefault("clients_per_round", len(federation))
    train.setdefault("progress", False)
    seed = train.get("seed", 0)
    mk = dict(model_kwargs or {})
    shape, c = federation.input_shape, federation.num_classes

    def backbone() -> nn.Module:
        return make_model(model, shape, c, seed=seed, **mk)

    def conditional(fed: Federation, cond_dim: int, scale: float) -> History:
        net = make_conditional_model(model, shape, c, cond_dim, seed=seed, cond_scale=scale, **mk)
        return simulate(fed, net, FedAvg(), **train)

    def fingerprinted() -> History:
        fed = fingerprint_federation(federation, num_eigenvalues, reference=reference, **(fingerprint_kwargs or {}))
        scale = cond_scale if cond_scale is not None else (20.0 if reference is not None else 2.5)
        return conditional(fed, num_eigenvalues, scale)

    def oracle() -> History:
        fed = oracle_federation(federation)
        return conditional(fed, fed[0].info["condition_dim"], oracle_scale)

    def true_clusters() -> int:
        return num_clusters if num_clusters is not None else len(set(cluster_ids(federation).tolist()))

    runs = {  # method -> its run, started only when asked for
        "fedavg": lambda: simulate(federation, backbone(), FedAvg(), **train),
        "local": lambda: simulate_local(federation, backbone(), **train),
        "ifca": lambda: simulate_ifca(federation, backbone(), true_clusters(), **train),
        "ditto": lambda: simulate_ditto(federation, backbone(), ditto_lam, ditto_strategy, **train),
        "gossip": lambda: simulate(federation, backbone(), Gossip(num_neighbours=num_neighbours), **train),
        "dac": lambda: simulate(federation, backbone(), DAC(num_neighbours), **train),
        "oracle": oracle,
        "conditional": fingerprinted,
    }
    out = {}
    for method in methods:
        out[method] = runs[method]()
        out[method].strategy = method
    return out

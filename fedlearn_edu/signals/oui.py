"""The Overfitting-Underfitting Indicator (OUI): how evenly a layer's units split a batch.

Given the pre-activations ``Z: Tensor[B, d]`` of one layer on a batch of ``B``
samples, unit ``j`` is *active* on sample ``b`` when ``Z[b, j] > 0``. With

    s_j = #samples on which unit j is active,     u_j = min(s_j, B - s_j)   (the minority count)

FedOUI's form (Fernandez-Hernandez et al., 2026) is

    OUI = clip( mean_j u_j / floor(B/2), 0, 1 ):

1 when every unit splits the batch in half, 0 when every unit is always on or
always off. The original OUI paper (Fernandez-Hernandez et al., 2025) measured the
same thing through Hamming distances between the activation patterns of pairs of
samples; the two are tied by the identity

    sum over pairs a < b of Hamming(a, b) = sum_j s_j (B - s_j),

which :func:`hamming_distances` and :func:`activation_counts` let you check.

Which layer: FedOUI reads the *penultimate pre-activations* of a client's model on
a fixed probe batch of its own training data. :func:`penultimate_preactivations`
captures them for any package model (``model(x, features=True)``):

======================  =========================================================
model                   the layer it returns (``Tensor[B, d]``)
======================  =========================================================
``MLP``                 the last hidden ``Linear``'s output, before its ReLU (d = last hidden size)
``CNN``                 ``fc2``'s output, before its ReLU (d = 192)
``SmallCNN``            ``fc1``'s output, before its ReLU (d = 128): FedOUI's "OUI layer"
``ResNet20``            the globally pooled features (d = 64 for width 16). Caveat: these
                        are averages of *post*-ReLU maps, so they are >= 0 and a unit is
                        "off" only when its whole map is zero; OUI there is not the
                        pre-activation quantity of the paper and tends to be small.
======================  =========================================================

For any other module pass ``layer="<submodule name>"``: a forward hook captures
that submodule's output (flattened to ``[B, -1]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from ..checks import check_bool, check_int
from ..utils import derive_seed

__all__ = [
    "oui",
    "oui_pairwise",
    "activation_counts",
    "hamming_distances",
    "penultimate_preactivations",
    "hooked_module",
    "MAX_PROBE_SIZE",
    "probe_indices",
    "probe_batch",
    "client_oui",
]


# --------------------------------------------------------------------------- #
# the metric
# --------------------------------------------------------------------------- #
def _check_preactivations(z, what: str = "preactivations") -> Tensor:
    if not isinstance(z, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of shape [B, d], got {type(z).__name__}.")
    if z.dim() != 2:
        raise ValueError(
            f"{what} must be Tensor[B, d] (one row per probe sample, one column per unit); "
            f"got shape {tuple(z.shape)}. Flatten extra axes first, e.g. z.flatten(1)."
        )
    b, d = z.shape
    if b < 2:
        raise ValueError(f"OUI needs a batch of at least B = 2 samples; got B = {b}.")
    if d < 1:
        raise ValueError("OUI needs at least one unit (d >= 1); got d = 0.")
    if z.is_floating_point() and not bool(torch.isfinite(z).all()):
        bad = (~torch.isfinite(z)).any(dim=1).nonzero()[0].item()
        raise ValueError(f"{what} contain NaN or Inf (first in sample {bad}); the model may have diverged.")
    return z


def _oui_values(z: Tensor) -> Tensor:
    """OUI of ``z: Tensor[..., B, d]`` along the last two axes (no checks); ``Tensor[...]``."""
    b = z.shape[-2]
    s = (z > 0).sum(dim=-2).cpu()  # integer counts; float64 on the CPU (MPS has no float64)
    u = torch.minimum(s, b - s).to(torch.float64)
    return (u / (b // 2)).mean(dim=-1).clamp(0.0, 1.0)


def activation_counts(preactivations: Tensor) -> Tensor:
    """``s_j``: on how many of the B samples each unit is active (pre-activation > 0).

    Args:
        preactivations: ``Tensor[B, d]``.

    Returns:
        ``Tensor[d]`` (int64), values in ``0..B``.

    Example:
        >>> activation_counts(torch.tensor([[1.0, -1.0], [2.0, -3.0], [-1.0, 0.5]]))
        tensor([2, 1])
    """
    z = _check_preactivations(preactivations)
    return (z > 0).sum(dim=0)


def oui(preactivations: Tensor) -> float:
    """FedOUI's Overfitting-Underfitting Indicator of one layer on one batch.

    ``OUI = clip(mean_j min(s_j, B - s_j) / floor(B/2), 0, 1)`` with ``s_j`` the number
    of samples on which unit ``j`` is active (pre-activation > 0).

    Reading it (as in the original OUI paper and chapter 6 of the book): near 0, units
    are almost always on or always off, so on this batch the layer acts as one linear
    map -- the *under-fitting* side (too much regularisation, or dead units); high, units
    split the samples in many ways and the network uses many linear pieces on a handful
    of samples -- the *over-fitting* side. FedOUI itself prefers neither end: it
    down-weights clients whose value is atypical for the round.

    Args:
        preactivations: ``Tensor[B, d]``, B >= 2 probe samples (rows) by d units.

    Returns:
        A float in ``[0, 1]``.

    Raises:
        ValueError: wrong rank, B < 2, d = 0, or NaN/Inf values.

    Example:
        >>> z = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, 1.0], [-1.0, 1.0]])
        >>> oui(z)   # unit 0 splits 2/2 (score 1), unit 1 is always on (score 0)
        0.5
    """
    return float(_oui_values(_check_preactivations(preactivations)))


def hamming_distances(preactivations: Tensor) -> Tensor:
    """Hamming distances between the binary activation patterns of every pair of samples.

    ``H[a, b] = #units j with 1[Z[a, j] > 0] != 1[Z[b, j] > 0]``.

    Args:
        preactivations: ``Tensor[B, d]``.

    Returns:
        ``Tensor[B, B]`` (int64), symmetric, zero diagonal. Its upper triangle sums to
        ``sum_j s_j (B - s_j)`` (see :func:`activation_counts`).

    Example:
        >>> hamming_distances(torch.tensor([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0]]))
        tensor([[0, 1, 2],
                [1, 0, 1],
                [2, 1, 0]])
    """
    m = (_check_preactivations(preactivations) > 0).to(torch.int64)
    # |a - b| on {0, 1} counts disagreements: sum_j a_j + b_j - 2 a_j b_j.
    ones = m.sum(dim=1)
    return ones.unsqueeze(1) + ones.unsqueeze(0) - 2 * (m @ m.T)


def oui_pairwise(preactivations: Tensor, clamp: bool = True) -> float:
    """The original OUI paper's Hamming-distance form, over *all* pairs of samples.

    ``mean over pairs a < b of min(H[a, b], floor(d/2)) / floor(d/2)``. The original code
    draws a random subset of pairs (28 by default) and averages over all ReLU layers;
    here every pair of the batch is used, for one layer.

    With ``clamp=False`` the per-pair cap is dropped: the value is
    ``(sum_j s_j (B - s_j) / C(B, 2)) / floor(d/2)`` by the pair identity, and can exceed 1
    slightly (at most ``B / (B - 1)`` times ``d / (2 floor(d/2))``).

    Both this and :func:`oui` are increasing in how evenly units split the batch:
    0 for constant patterns, near 1 for "random-looking" ones. They are not equal;
    the chapter shows how they relate.

    Args:
        preactivations: ``Tensor[B, d]``, B >= 2; d >= 2 (so that floor(d/2) >= 1).
        clamp: cap every pair's distance at floor(d/2) as the original paper does.

    Returns:
        A float (in ``[0, 1]`` when ``clamp``).

    Example:
        >>> z = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0]])
        >>> oui_pairwise(z)   # distances 1, 2, 1 capped at 1
        1.0
    """
    clamp = check_bool(clamp, "clamp")
    z = _check_preactivations(preactivations)
    b, d = z.shape
    if d < 2:
        raise ValueError("oui_pairwise normalises by floor(d/2) and needs d >= 2 units; got d = 1.")
    h = hamming_distances(z)
    iu = torch.triu_indices(b, b, offset=1)
    pairs = h[iu[0], iu[1]].to(torch.float64)
    half = d // 2
    if clamp:
        pairs = pairs.clamp(max=half)
    return float(pairs.mean() / half)


# --------------------------------------------------------------------------- #
# capturing the layer
# --------------------------------------------------------------------------- #
class _EvalMode:
    """Context manager: the model in eval mode, its previous mode restored afterwards."""

    def __init__(self, model: nn.Module):
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()
        return self.model

    def __exit__(self, *exc):
        self.model.train(self.was_training)
        return False


def penultimate_preactivations(
    model: nn.Module, x: Tensor, params: Mapping[str, Tensor] | None = None, layer: str | None = None
) -> Tensor:
    """The layer FedOUI reads, on a batch: ``Tensor[B, d]`` pre-activations, in eval mode, no grad.

    Args:
        model: a package model (``model(x, features=True)`` returns the penultimate
            pre-activations; see the module docstring for the layer of each), or any
            module together with ``layer``.
        x: ``Tensor[B, *input_shape]``, on the model's device.
        params: parameters to use instead of the module's own (``functional_call``).
        layer: name of a submodule (as in ``model.named_modules()``) whose output to
            capture with a forward hook instead of ``features=True``.

    Returns:
        ``Tensor[B, d]``.

    Example:
        >>> from fedlearn_edu.models import SmallCNN
        >>> penultimate_preactivations(SmallCNN((1, 8, 8), 10), torch.randn(4, 1, 8, 8)).shape
        torch.Size([4, 128])
    """
    params = dict(params) if params is not None else None
    with _EvalMode(model), torch.no_grad():
        if layer is None:
            try:
                if params is None:
                    z = model(x, features=True)
                else:
                    z = functional_call(model, params, (x,), {"features": True})
            except TypeError as err:
                if "features" not in str(err):
                    raise
                raise TypeError(
                    f"{type(model).__name__}.forward does not accept features=True; pass "
                    "layer='<name of the penultimate module>' to capture it with a forward hook."
                ) from err
        else:
            module = hooked_module(model, layer)
            captured: list[Tensor] = []
            handle = module.register_forward_hook(lambda _m, _i, out: captured.append(out))
            try:
                if params is None:
                    model(x)
                else:
                    functional_call(model, params, (x,))
            finally:
                handle.remove()
            if not captured or not isinstance(captured[-1], Tensor):
                raise ValueError(f"layer={layer!r}: that submodule produced no tensor output in the forward pass.")
            z = captured[-1]
    return z.flatten(1)


def hooked_module(model: nn.Module, layer: str) -> nn.Module:
    """The submodule ``layer`` of ``model`` whose output the OUI reads.

    Args:
        model: the network.
        layer: a name from ``model.named_modules()``.

    Returns:
        The submodule.

    Raises:
        TypeError: ``layer`` is not a string.
        ValueError: ``model`` has no submodule of that name (the message lists the names).
    """
    if not isinstance(layer, str):
        raise TypeError(f"layer must be None or a submodule name (str), got {layer!r}.")
    try:
        return model.get_submodule(layer)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        raise ValueError(
            f"layer={layer!r} names no submodule of {type(model).__name__}; choose one of {names}."
        ) from None


#: the largest OUI probe batch (B samples per client, every round; 2**64 would not fit in memory)
MAX_PROBE_SIZE = 100_000


def probe_indices(num_samples: int, probe_size: int = 32, seed: int = 0) -> Tensor:
    """Which of a client's training samples form its fixed OUI probe batch.

    The first ``probe_size`` positions of a permutation of ``range(num_samples)`` drawn
    from ``torch.Generator().manual_seed(derive_seed(seed, num_samples))``. It depends
    only on the client's own size and ``seed``, so a client computes the same probe in
    every round without any id from the server. A client with fewer than
    ``probe_size`` samples draws ``probe_size`` indices *with* replacement (as the
    authors' code does), so every probe has the same B and every OUI the same scale.

    Args:
        num_samples: the client's number of training samples, >= 1.
        probe_size: B, in ``[2, MAX_PROBE_SIZE]`` (100000; FedOUI uses 32).
        seed: the run's seed.

    Raises:
        TypeError: ``probe_size`` not an integer.
        ValueError: no samples, or ``probe_size`` out of range.

    Returns:
        ``Tensor[probe_size]`` (int64).

    Example:
        >>> probe_indices(100, 4, seed=0).shape
        torch.Size([4])
    """
    n = int(num_samples)
    b = check_int(probe_size, "probe_size", 2, MAX_PROBE_SIZE)  # the OUI needs B >= 2
    if n < 1:
        raise ValueError("A client needs at least one training sample for an OUI probe.")
    g = torch.Generator().manual_seed(derive_seed(seed, n))
    if n >= b:
        return torch.randperm(n, generator=g)[:b]
    return torch.randint(0, n, (b,), generator=g)


def probe_batch(x: Tensor, probe_size: int = 32, seed: int = 0) -> Tensor:
    """``x[probe_indices(len(x), probe_size, seed)]``: a client's fixed probe inputs.

    Args:
        x: ``Tensor[n, ...]``, the client's training inputs.
        probe_size: B.
        seed: the run's seed.

    Returns:
        ``Tensor[B, ...]``.
    """
    idx = probe_indices(x.shape[0], probe_size, seed)
    return x[idx.to(x.device)]


def client_oui(
    model: nn.Module,
    params: Mapping[str, Tensor],
    probes: Tensor | Sequence[Tensor],
    layer: str | None = None,
    *,
    nan_rows: bool = False,
) -> Tensor:
    """OUI of m clients' models, each on its own probe batch.

    Args:
        model: the architecture (see :func:`penultimate_preactivations`).
        params: stacked client parameters ``{name: Tensor[m, ...]}`` (e.g. ``local.params``).
        probes: ``Tensor[m, B, *input_shape]`` or a sequence of m ``Tensor[B, *input_shape]``.
        layer: optional submodule name to hook instead of ``features=True``.
        nan_rows: a model whose pre-activations hold NaN/Inf (a diverged client) gets OUI NaN
            (the driver then drops that client) instead of a ``ValueError``.

    Returns:
        ``Tensor[m]`` (float64, on the CPU), one OUI per client. With ``layer=None`` all
        clients run in one ``torch.func.vmap`` pass; with a hook they run one after another.

    Example:
        >>> from fedlearn_edu.models import MLP
        >>> from fedlearn_edu.params import get_params, stack_params
        >>> model = MLP((1, 8, 8), 10, hidden=(16,))
        >>> stacked = stack_params([get_params(model)] * 3)
        >>> client_oui(model, stacked, torch.randn(3, 32, 1, 8, 8)).shape
        torch.Size([3])
    """
    nan_rows = check_bool(nan_rows, "nan_rows")
    if not isinstance(probes, Tensor):
        probes = torch.stack(list(probes))
    m = probes.shape[0]
    if probes.dim() < 2 or probes.shape[1] < 2:
        raise ValueError(f"probes must be Tensor[m, B, ...] with B >= 2; got shape {tuple(probes.shape)}.")
    for k, v in params.items():
        if v.shape[0] != m:
            raise ValueError(f"params[{k!r}] has {v.shape[0]} clients on its leading axis but there are {m} probes.")
    if layer is None:

        def features(p, x):
            return functional_call(model, p, (x,), {"features": True}).flatten(1)

        with _EvalMode(model), torch.no_grad():
            try:
                z = vmap(features)(dict(params), probes)
            except TypeError as err:
                if "features" not in str(err):
                    raise
                raise TypeError(
                    f"{type(model).__name__}.forward does not accept features=True; pass layer='<module name>'."
                ) from err
    else:
        z = torch.stack(
            [
                penultimate_preactivations(model, probes[i], {k: v[i] for k, v in params.items()}, layer)
                for i in range(m)
            ]
        )
    if not bool(torch.isfinite(z).all()):
        bad = (~torch.isfinite(z.reshape(m, -1))).any(dim=1)
        if not nan_rows:
            raise ValueError(
                f"The pre-activations of row {int(bad.nonzero()[0])} (of the {m} stacked models) contain NaN or Inf."
            )
        # the bad rows are zeroed so the others are computed exactly as without them, then marked NaN
        values = _oui_values(torch.where(bad.reshape(m, *([1] * (z.dim() - 1))), torch.zeros_like(z), z))
        return values.masked_fill(bad.cpu(), float("nan"))
    return _oui_values(z)

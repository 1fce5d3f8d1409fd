"""PCA fingerprints: a client's data summarised by the leading eigenvalues of a covariance.

Client-conditional FL (Brännvall, 2026) gives every client i a vector
``s_i``: the ``l`` largest eigenvalues of the sample covariance of the
augmented matrix

    A_i = [ phi(X_i) , E(y_i) ]        (one row per training sample)

where ``phi`` maps an input to a feature vector (default: the flattened input)
and ``E`` encodes the label (default: one-hot). The client computes ``s_i``
once, from its own training data, and keeps it: only model updates leave
the client.

What the eigenvalues keep and lose (proved in the book's chapter 7):

* they do not depend on the order of the samples;
* they do not change when ``phi(x)`` is replaced by ``Q phi(x)`` for an
  orthogonal ``Q`` -- in particular when images are rotated by a multiple of
  90 degrees (a permutation of pixels) -- nor when the columns of ``E(y)``
  are permuted by an orthogonal matrix, e.g. a relabelling of the classes
  with one-hot codes. Such shifts are invisible to the fingerprint unless
  ``phi`` or ``E`` break the symmetry (``label_encoding="ordinal"`` does so
  for relabellings; see the chapter).

The covariance is never formed when ``p = dim(A) > n``: the non-zero
eigenvalues of ``A_c^T A_c`` and ``A_c A_c^T`` (``A_c`` centred) coincide, so
the smaller of the two Gram matrices (``min(n, p)`` squared) is
diagonalised.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..checks import check_int, check_positive

__all__ = [
    "pca_fingerprint",
    "client_fingerprints",
    "reference_fingerprint",
    "RandomProjection",
    "label_encoding_matrix",
    "NORMALIZATIONS",
    "LABEL_ENCODINGS",
]

NORMALIZATIONS = (None, "trace")
LABEL_ENCODINGS = ("onehot", "graded", "ordinal")


class RandomProjection:
    """A fixed, seeded Gaussian random projection ``phi(x) = R flatten(x) / sqrt(k)``.

    For large inputs (e.g. CIFAR's 3,072 pixels) the covariance of the flattened
    input is expensive when a client holds many samples; projecting to ``k``
    dimensions first bounds the work at ``O(n k min(n, k))``. ``R`` has i.i.d.
    standard normal entries drawn from ``torch.Generator().manual_seed(seed)``,
    so every client that uses the same ``(in_features, out_features, seed)``
    applies the same map -- a convention, not a message: nothing is exchanged.

    Args:
        in_features: size of one flattened input.
        out_features: k, the projected dimension.
        seed: seed of ``R``.

    Example:
        >>> phi = RandomProjection(3 * 32 * 32, 256, seed=0)
        >>> phi(torch.rand(5, 3, 32, 32)).shape
        torch.Size([5, 256])
    """

    def __init__(self, in_features: int, out_features: int, seed: int = 0):
        if int(in_features) < 1 or int(out_features) < 1:
            raise ValueError(f"RandomProjection needs positive sizes, got {in_features} -> {out_features}.")
        self.in_features, self.out_features, self.seed = int(in_features), int(out_features), int(seed)
        g = torch.Generator().manual_seed(self.seed)
        self.matrix = torch.randn(self.out_features, self.in_features, generator=g, dtype=torch.float64)
        self.matrix /= math.sqrt(self.out_features)

    def __call__(self, x: Tensor) -> Tensor:
        """Project ``Tensor[n, ...]`` inputs (flattened) to ``Tensor[n, out_features]`` float64 features."""
        flat = x.reshape(x.shape[0], -1)
        if flat.shape[1] != self.in_features:
            raise ValueError(f"RandomProjection expects inputs with {self.in_features} entries, got {flat.shape[1]}.")
        return flat.to(torch.float64) @ self.matrix.to(flat.device).T

    def __repr__(self) -> str:
        return f"RandomProjection({self.in_features}, {self.out_features}, seed={self.seed})"


def label_encoding_matrix(num_classes: int, encoding="onehot") -> Tensor:
    """The ``[num_classes, r]`` matrix E whose row y encodes label y.

    ``"onehot"``: the identity (r = C), as in the paper. Its rows are orthonormal, so a
    relabelling of the classes (a permutation of the columns) is an orthogonal map and
    leaves the fingerprint unchanged.

    **Ours**, to break that symmetry:

    * ``"graded"``: one-hot with class c scaled by ``w_c = 0.2 + 0.8 c / (C - 1)``
      (r = C): the class codes have different lengths, so which images carry which
      label changes the covariance spectrum;
    * ``"ordinal"``: one column ``y / (C - 1)`` (r = 1).

    A user-given ``Tensor[C, r]`` is returned as it is (float64).

    Args:
        num_classes: C.
        encoding: ``"onehot"``, ``"graded"``, ``"ordinal"`` or a ``Tensor[C, r]``.

    Returns:
        float64 ``Tensor[C, r]``.

    Raises:
        ValueError: an unknown encoding, or a matrix without C rows.
    """
    c = int(num_classes)
    if isinstance(encoding, Tensor):
        if encoding.dim() != 2 or encoding.shape[0] != c:
            raise ValueError(f"A label encoding tensor must be [num_classes={c}, r]; got {tuple(encoding.shape)}.")
        return encoding.to(torch.float64)
    if encoding == "onehot":
        return torch.eye(c, dtype=torch.float64)
    if encoding == "graded":
        return torch.diag(0.2 + 0.8 * torch.arange(c, dtype=torch.float64) / max(c - 1, 1))
    if encoding == "ordinal":
        return (torch.arange(c, dtype=torch.float64) / max(c - 1, 1)).unsqueeze(1)
    raise ValueError(f"Unknown label_encoding {encoding!r}; choose one of {LABEL_ENCODINGS} or pass a Tensor[C, r].")


def _feature_matrix(features: Tensor, feature_map) -> Tensor:
    if feature_map is None or feature_map == "flatten":
        return features.reshape(features.shape[0], -1)
    if callable(feature_map):
        out = feature_map(features)
        if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != features.shape[0]:
            raise ValueError(
                "feature_map must return a Tensor[n, k] with one row per sample; got "
                f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))}."
            )
        return out
    raise ValueError(f"feature_map must be None, 'flatten' or a callable; got {feature_map!r}.")


def pca_fingerprint(
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    num_eigenvalues: int = 32,
    normalize: str | None = "trace",
    *,
    feature_map: str | Callable[[Tensor], Tensor] | None = "flatten",
    label_encoding: str | Tensor = "onehot",
    label_scale: float = 1.0,
) -> Tensor:
    """The leading eigenvalues of the sample covariance of ``[phi(x), onehot(y)]``.

    Args:
        features: ``Tensor[n, ...]`` one client's inputs (any shape after the sample axis).
        labels: ``Tensor[n]`` integer labels in ``[0, num_classes)``.
        num_classes: C, the size of the label space (the width of the one-hot block).
        num_eigenvalues: l, the length of the fingerprint (32 by default).
        normalize: ``"trace"`` (default) divides by the sum of *all* eigenvalues, the
            total variance ``tr(Cov A)``, so the entries are fractions of variance
            explained (scikit-learn's ``explained_variance_ratio_``) and comparable
            across clients whose data have different scales; ``None`` returns the raw
            eigenvalues (scikit-learn's ``explained_variance_``). A client whose rows are
            all equal has zero variance and gets the zero vector either way.
        feature_map: phi. ``"flatten"`` (default) uses the input as it is, flattened; a
            callable maps ``Tensor[n, ...]`` to ``Tensor[n, k]``, e.g. a
            :class:`RandomProjection` for large inputs.
        label_encoding: ``"onehot"`` (default, the paper's), ``"graded"`` or ``"ordinal"``
            (**ours**, see :func:`label_encoding_matrix`), or a ``Tensor[C, r]`` whose row y
            encodes label y.
        label_scale: the label block is multiplied by this (**ours**; 1 by default). With
            large inputs the one-hot block's variance (at most 1) is small beside the
            pixels'; a larger scale lets the label structure reach the leading eigenvalues.

    Returns:
        ``Tensor[num_eigenvalues]`` (float64, on the input's device): the eigenvalues of the
        ``p x p`` covariance (``ddof = 1``) in descending order, zero-padded when fewer than
        ``num_eigenvalues`` exist (``p < l``; eigenvalues beyond the rank ``n - 1`` are 0).

    Raises:
        ValueError: fewer than 2 samples, labels outside ``[0, num_classes)``, NaN/Inf in
            the features, mismatched lengths, or a bad argument.

    Example:
        >>> x, y = torch.rand(50, 1, 8, 8), torch.arange(50) % 10
        >>> s = pca_fingerprint(x, y, num_classes=10, num_eigenvalues=32)
        >>> s.shape, bool((s[:-1] >= s[1:]).all()), float(s.sum()) <= 1.0 + 1e-12
        (torch.Size([32]), True, True)
    """
    if not isinstance(features, Tensor):
        features = torch.as_tensor(features)
    if not isinstance(labels, Tensor):
        labels = torch.as_tensor(labels)
    if features.dim() < 1:
        raise ValueError("features must have a leading sample axis: Tensor[n, ...].")
    n = int(features.shape[0])
    if labels.dim() != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must be Tensor[n] with n = {n} (one per sample); got shape {tuple(labels.shape)}.")
    if n < 2:
        raise ValueError(f"A PCA fingerprint needs at least 2 samples (the covariance uses n - 1); got {n}.")
    c = check_int(num_classes, "num_classes", 1)
    l = check_int(num_eigenvalues, "num_eigenvalues", 1)
    check_positive(label_scale, "label_scale", allow_zero=True)
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}.")
    if labels.is_floating_point():
        if not bool(torch.isfinite(labels).all()) or not bool((labels == labels.round()).all()):
            raise ValueError("labels must be integer class ids; got non-integer or NaN values.")
    labels = labels.long()
    if int(labels.min()) < 0 or int(labels.max()) >= c:
        raise ValueError(
            f"labels must lie in [0, {c - 1}] (num_classes={c}); "
            f"found values in [{int(labels.min())}, {int(labels.max())}]."
        )
    if features.is_floating_point() and not bool(torch.isfinite(features).all()):
        bad = (~torch.isfinite(features.reshape(n, -1))).any(1).nonzero()[0].item()
        raise ValueError(f"features contain NaN or Inf (first at sample {bad}); clean the data first.")

    if features.device.type == "mps":  # MPS has no float64: the fingerprint is computed once, on the CPU
        features, labels = features.cpu(), labels.cpu()
    phi = _feature_matrix(features, feature_map).to(torch.float64)
    if not bool(torch.isfinite(phi).all()):
        raise ValueError("feature_map produced NaN or Inf values.")
    enc = float(label_scale) * label_encoding_matrix(c, label_encoding).to(phi.device)
    a = torch.cat([phi, enc[labels.to(phi.device)]], dim=1)  # A = [phi(X), E(y)], n x p
    a = a - a.mean(dim=0, keepdim=True)  # centre the columns
    p = a.shape[1]
    gram = a @ a.T if n <= p else a.T @ a  # the smaller Gram matrix
    eig = torch.linalg.eigvalsh(gram / (n - 1)).flip(0).clamp(min=0)  # descending, >= 0
    if normalize == "trace":
        total = eig.sum()
        eig = eig / total if float(total) > 0 else eig
    out = torch.zeros(l, dtype=torch.float64, device=a.device)
    k = min(l, eig.shape[0])
    out[:k] = eig[:k]
    return out


def client_fingerprints(
    federation,
    num_eigenvalues: int = 32,
    normalize: str | None = "trace",
    *,
    feature_map="flatten",
    label_encoding="onehot",
    label_scale: float = 1.0,
) -> Tensor:
    """Every client's fingerprint from its own **training** split: ``Tensor[N, l]``.

    This loop stands for N separate computations, one on each client; in a real
    deployment no party ever holds this matrix. The simulator never sends it either:
    :func:`fedlearn_edu.conditional.condition_federation` stores each row with its
    own client's data.

    Args:
        federation: the clients.
        num_eigenvalues: ``l``.
        normalize: the spectrum's normalisation (see :func:`pca_fingerprint`).
        feature_map: the feature map applied to the inputs first.
        label_encoding: how the labels join the features (see :func:`label_encoding_matrix`).
        label_scale: the weight of the label block, >= 0.

    Returns:
        float64 ``Tensor[N, l]``, row i client i's fingerprint.
    """
    rows = [
        pca_fingerprint(
            c.train_x,
            c.train_y,
            federation.num_classes,
            num_eigenvalues,
            normalize,
            feature_map=feature_map,
            label_encoding=label_encoding,
            label_scale=label_scale,
        )
        for c in federation
    ]
    return torch.stack(rows)


def reference_fingerprint(
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    sample_size: int,
    num_draws: int = 8,
    seed: int = 0,
    **fingerprint_kwargs,
) -> Tensor:
    """The mean fingerprint of ``num_draws`` random subsets of ``sample_size`` samples of *public* data.

    **Ours.** All clients' fingerprints share a large common part (every covariance
    spectrum decays in a similar way) and differ by a few hundredths. A network fed
    ``s_i`` as it is must learn to ignore the common part before it can use the
    differences, which plain SGD does slowly. Subtracting a reference computed on public
    data (an IID sample, e.g. a dataset's official test split) leaves the differences,
    ``s_i - s_ref``. The server can broadcast ``s_ref`` once; it describes public data
    only, and nothing goes back. Draws of the clients' own size ``sample_size`` give the
    reference the same small-sample bias as the clients' spectra.

    Args:
        features: the public inputs' features ``Tensor[n, p]`` (as in :func:`pca_fingerprint`).
        labels: their labels ``Tensor[n]``.
        num_classes: size of the label space.
        sample_size: samples per draw (use the clients' typical training-set size).
        num_draws: subsets averaged.
        seed: seed of the subsets.
        **fingerprint_kwargs: passed to :func:`pca_fingerprint` (use the clients' settings).

    Returns:
        ``Tensor[num_eigenvalues]`` (float64).
    """
    n = int(labels.shape[0])
    size = check_int(sample_size, f"sample_size (the public data hold {n} samples)", 2, n)
    check_int(num_draws, "num_draws", 1)
    g = torch.Generator().manual_seed(int(seed))
    draws = []
    for _ in range(int(num_draws)):
        idx = torch.randperm(n, generator=g)[:size]
        draws.append(pca_fingerprint(features[idx], labels[idx], num_classes, **fingerprint_kwargs))
    return torch.stack(draws).mean(0)

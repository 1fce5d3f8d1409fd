"""Clustered heterogeneity: label, covariate and concept shift, alone or combined.

Clients are grouped into K clusters; all clients of one cluster share a data
distribution and the clusters differ by

=================  ==========================================================
``"label"``        which classes the clients see (a class subset per cluster)
``"covariate"``    how the inputs look (images rotated by a per-cluster angle)
``"concept"``      what the labels mean (a per-cluster permutation of the classes:
                   the same image gets a different label in another cluster)
=================  ==========================================================

and any combination, e.g. ``"label+concept"`` or ``"combined"`` (all three):
cluster k then has its own class subset *and* its own angle *and* its own
permutation. Every client records its cluster and its transforms in
``client.info`` (``"cluster"``, ``"classes"``, ``"angle"``, ``"permutation"``),
which is what the Oracle baseline and the plots read.

``samples_per_client`` is the sparsity knob: the same clusters with fewer
samples per client. Samples are drawn without replacement, so no two clients
share a sample; within its class subset a client is class-balanced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int, check_range
from .federation import ClientData, Federation

__all__ = [
    "SHIFTS",
    "parse_shift",
    "rotate_images",
    "permute_labels",
    "label_shift_classes",
    "concept_permutations",
    "shifted_federation",
    "cluster_ids",
    "appearance_shift",
]

SHIFTS = ("label", "covariate", "concept")
_ALIASES = {
    "combined": ("label", "covariate", "concept"),
    "all": ("label", "covariate", "concept"),
    "none": (),
    "iid": (),
}


def parse_shift(shift: str | Sequence[str]) -> tuple[str, ...]:
    """``"label+concept"`` -> ``("label", "concept")``; ``"combined"`` -> all three; ``"none"`` -> ().

    Args:
        shift: a name, a ``+``-joined combination, an alias (``"combined"``, ``"none"``) or a
            sequence of names.

    Returns:
        The shift kinds, in the order of :data:`SHIFTS`.

    Raises:
        ValueError: an unknown shift.
    """
    if isinstance(shift, str):
        key = shift.strip().lower()
        if key in _ALIASES:
            return _ALIASES[key]
        parts = [p.strip() for p in key.replace(",", "+").split("+") if p.strip()]
    else:
        parts = [str(p).strip().lower() for p in shift]
    bad = [p for p in parts if p not in SHIFTS]
    if bad:
        raise ValueError(
            f"Unknown shift type(s) {bad}; use {SHIFTS}, a '+'-joined combination "
            f"such as 'label+concept', or one of {sorted(_ALIASES)}."
        )
    return tuple(s for s in SHIFTS if s in parts)


def rotate_images(x: Tensor, angle: float) -> Tensor:
    """Rotate images ``Tensor[n, C, H, W]`` counter-clockwise by ``angle`` degrees.

    Multiples of 90 degrees on square images use :func:`torch.rot90`: an exact
    permutation of the pixels (an *orthogonal* map of the flattened image). Other
    angles resample bilinearly about the centre, with zeros outside the image.

    Args:
        x: ``Tensor[n, C, H, W]``.
        angle: degrees, counter-clockwise.

    Returns:
        ``Tensor[n, C, H, W]``.

    Example:
        >>> x = torch.arange(4.0).reshape(1, 1, 2, 2)
        >>> rotate_images(x, 90)[0, 0]
        tensor([[1., 3.],
                [0., 2.]])
    """
    if x.dim() != 4:
        raise ValueError(f"rotate_images needs images shaped [n, C, H, W]; got {tuple(x.shape)}.")
    angle = float(angle) % 360.0
    quarter = angle / 90.0
    if abs(quarter - round(quarter)) < 1e-9 and (x.shape[2] == x.shape[3] or round(quarter) % 2 == 0):
        return torch.rot90(x, int(round(quarter)) % 4, dims=(2, 3)).contiguous()
    theta = math.radians(angle)
    c, s = math.cos(theta), math.sin(theta)
    # affine_grid maps output coordinates to input coordinates: use the inverse rotation.
    mat = torch.tensor([[c, -s, 0.0], [s, c, 0.0]], dtype=x.dtype, device=x.device)
    grid = torch.nn.functional.affine_grid(mat.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def permute_labels(y: Tensor, permutation: Sequence[int]) -> Tensor:
    """Relabel: class ``c`` becomes ``permutation[c]``.

    Args:
        y: ``Tensor[n]`` integer labels.
        permutation: ``permutation[c]`` is class ``c``'s new label.

    Returns:
        ``Tensor[n]``, the new labels.
    """
    perm = torch.as_tensor(np.asarray(permutation), dtype=torch.long)
    if sorted(perm.tolist()) != list(range(perm.numel())):
        raise ValueError(f"permutation must be a permutation of 0..{perm.numel() - 1}; got {perm.tolist()}.")
    return perm.to(y.device)[y.long()]


def label_shift_classes(
    num_classes: int, num_clusters: int, classes_per_cluster: int | None = None, seed: int = 0
) -> list[list[int]]:
    """Class subsets, one per cluster.

    ``classes_per_cluster=None`` (default): the classes, in a seeded random order, are
    cut into ``num_clusters`` disjoint groups of near-equal size (10 classes, 4 clusters:
    sizes 3, 3, 2, 2). An integer: every cluster draws that many classes at random
    (subsets may overlap; all distinct when possible).

    Args:
        num_classes: size of the label space.
        num_clusters: K.
        classes_per_cluster: ``None`` for disjoint groups, or the size of each cluster's subset.
        seed: seeds the order and the draws.

    Returns:
        K sorted lists of class ids.
    """
    c = check_int(num_classes, "num_classes", 2)
    k = check_int(num_clusters, "num_clusters", 1)
    rng = np.random.default_rng(seed)
    if classes_per_cluster is None:
        if k > c:
            raise ValueError(
                f"Cannot split {c} classes into {k} disjoint non-empty groups; "
                "pass classes_per_cluster to let subsets overlap."
            )
        return [sorted(int(v) for v in g) for g in np.array_split(rng.permutation(c), k)]
    m = check_int(classes_per_cluster, "classes_per_cluster", 1)
    if m > c:
        raise ValueError(f"classes_per_cluster={m} exceeds num_classes={c}.")
    subsets: list[list[int]] = []
    for _ in range(k):
        for _try in range(100):
            cand = sorted(int(v) for v in rng.choice(c, m, replace=False))
            if cand not in subsets or math.comb(c, m) <= len(subsets):
                break
        subsets.append(cand)
    return subsets


def _num_derangements(n: int) -> int:
    """Permutations of n items that move every item: D(n) = (n - 1)(D(n-1) + D(n-2))."""
    a, b = 1, 0  # D(0), D(1)
    for i in range(2, n + 1):
        a, b = b, (i - 1) * (a + b)
    return b if n >= 1 else a


def concept_permutations(num_classes: int, num_clusters: int, seed: int = 0) -> list[list[int]]:
    """One label permutation per cluster: the identity for cluster 0, derangements for the others.

    Args:
        num_classes: size of the label space, >= 2.
        num_clusters: K.
        seed: seeds the derangements (no class keeps its label).

    Returns:
        ``K`` lists, each a permutation of ``0..num_classes-1``; cluster ``j`` relabels class
        ``v`` as ``perms[j][v]``.

    Raises:
        ValueError: fewer than ``K - 1`` distinct derangements of ``num_classes`` exist.
    """
    c = check_int(num_classes, "num_classes", 2)
    k = check_int(num_clusters, "num_clusters", 1)
    derangements = _num_derangements(c)
    if k - 1 > derangements:
        raise ValueError(
            f"{k} clusters need {k - 1} distinct derangements of {c} classes besides the identity, "
            f"but only {derangements} exist; use at most {derangements + 1} clusters for concept shift."
        )
    rng = np.random.default_rng(seed)
    perms = [list(range(c))]
    while len(perms) < k:
        p = rng.permutation(c)
        if np.all(p != np.arange(c)) and p.tolist() not in perms:
            perms.append([int(v) for v in p])
    return perms


def _load_pool(data, num_classes, root, download, merge=True) -> tuple[Tensor, Tensor, int, str]:
    if isinstance(data, str):
        from .datasets import dataset_info, load_dataset

        info = dataset_info(data)
        train, test = load_dataset(info.name, root=root, download=download)
        if not merge:
            return train.tensors[0], train.tensors[1], info.num_classes, info.name
        x = torch.cat([train.tensors[0], test.tensors[0]])
        y = torch.cat([train.tensors[1], test.tensors[1]])
        return x, y, info.num_classes, info.name
    try:
        x, y = data
    except (TypeError, ValueError):
        raise TypeError("data must be a dataset name (e.g. 'digits') or a pair (x, y) of tensors.") from None
    x, y = torch.as_tensor(x), torch.as_tensor(y).long()
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]} labels.")
    c = int(num_classes) if num_classes is not None else int(y.max()) + 1
    return x, y, c, "custom data"


def _cluster_shifts(kinds, x, c, k, classes_per_cluster, class_subsets, angles, permutations, seed):
    """What distinguishes the clusters: each one's class subset, rotation angle and label permutation."""
    if "label" in kinds:
        subsets = (
            [sorted(int(v) for v in s) for s in class_subsets]
            if class_subsets is not None
            else label_shift_classes(c, k, classes_per_cluster, seed=seed)
        )
        if len(subsets) != k or any(len(s) == 0 or min(s) < 0 or max(s) >= c for s in subsets):
            raise ValueError(f"class_subsets must hold {k} non-empty lists of classes in [0, {c - 1}].")
    else:
        subsets = [list(range(c))] * k
    if "covariate" in kinds:
        if x.dim() != 4:
            raise ValueError(f"Covariate shift rotates images: x must be [n, C, H, W], got {tuple(x.shape)}.")
        rot = [float(a) for a in angles] if angles is not None else [360.0 * j / k for j in range(k)]
        if len(rot) != k:
            raise ValueError(f"angles must give one angle per cluster ({k}), got {len(rot)}.")
    else:
        rot = [0.0] * k
    if "concept" in kinds:
        perms = (
            [list(map(int, p)) for p in permutations]
            if permutations is not None
            else concept_permutations(c, k, seed=seed + 1)
        )
        if len(perms) != k or any(sorted(p) != list(range(c)) for p in perms):
            raise ValueError(f"permutations must hold {k} permutations of 0..{c - 1}.")
    else:
        perms = [list(range(c))] * k
    return subsets, rot, perms


def _class_quotas(y, c, subsets, cluster_of, samples_per_client, n_test_fixed, rng):
    """Per-class quotas: ``(class_pool, quotas)``, each class's shuffled sample ids and ``quotas[i, cls]``."""
    n_clients = len(cluster_of)
    class_pool = [rng.permutation(np.flatnonzero(y.numpy() == cls)) for cls in range(c)]
    demand = np.zeros(c, dtype=np.int64)  # clients that need each class
    for j in cluster_of:
        demand[subsets[j]] += 1
    if samples_per_client is None:
        # the largest balanced size every client can get
        q = min(len(class_pool[cls]) // demand[cls] for cls in range(c) if demand[cls] > 0)
        sizes = np.array([q * len(subsets[j]) for j in cluster_of])
        if n_test_fixed is not None:
            if int(sizes.min()) - n_test_fixed < 1:
                raise ValueError(f"Not enough data for {n_test_fixed} test samples per client.")
            sizes = sizes - n_test_fixed
    else:
        sizes = np.full(
            n_clients, check_int(samples_per_client, "samples_per_client", 2 if n_test_fixed is None else 1)
        )
    if n_test_fixed is not None:
        sizes = sizes + n_test_fixed
    quotas = np.zeros((n_clients, c), dtype=np.int64)
    for i, j in enumerate(cluster_of):
        s = subsets[j]
        base, extra = divmod(int(sizes[i]), len(s))
        quotas[i, s] = base
        quotas[i, [s[v] for v in rng.permutation(len(s))[:extra]]] += 1
    need = quotas.sum(0)
    short = [(cls, int(need[cls]), len(class_pool[cls])) for cls in range(c) if need[cls] > len(class_pool[cls])]
    if short:
        cls, want, have = short[0]
        raise ValueError(
            f"Not enough data: class {cls} is needed {want} times but has {have} samples. "
            "Lower samples_per_client or use fewer clients."
        )
    return class_pool, quotas


def _deal(x, y, class_pool, quotas, cluster_of, shifts, kinds, test_fraction, n_test_fixed, rng) -> list[ClientData]:
    """Deal the samples, transform them per cluster (``shifts = (subsets, rot, perms)``), split train/test."""
    subsets, rot, perms = shifts
    c = quotas.shape[1]
    taken = np.zeros(c, dtype=np.int64)
    clients = []
    for i, j in enumerate(cluster_of):
        idx = []
        for cls in range(c):
            q = int(quotas[i, cls])
            if q:
                idx.append(class_pool[cls][taken[cls] : taken[cls] + q])
                taken[cls] += q
        idx = rng.permutation(np.concatenate(idx))
        xi, yi = x[torch.as_tensor(idx)], y[torch.as_tensor(idx)]
        if rot[j] % 360:
            xi = rotate_images(xi, rot[j])
        yi = permute_labels(yi, perms[j])
        n = idx.size
        if n_test_fixed is not None:
            n_test = n_test_fixed
        else:
            n_test = int(min(max(round(test_fraction * n), 1), n - 1)) if test_fraction > 0 and n >= 2 else 0
        info = {
            "cluster": int(j),
            "classes": [perms[j][v] for v in subsets[j]],
            "angle": rot[j],
            "permutation": list(perms[j]),
            "shift": "+".join(kinds) or "none",
        }
        clients.append(ClientData(xi[n_test:], yi[n_test:], xi[:n_test], yi[:n_test], info))
    return clients


def shifted_federation(
    data: str | tuple[Tensor, Tensor] = "digits",
    shift: str | Sequence[str] = "label",
    num_clusters: int = 4,
    clients_per_cluster: int = 4,
    samples_per_client: int | None = None,
    *,
    classes_per_cluster: int | None = None,
    class_subsets: Sequence[Sequence[int]] | None = None,
    angles: Sequence[float] | None = None,
    permutations: Sequence[Sequence[int]] | None = None,
    test_fraction: float = 0.2,
    test_samples: int | None = None,
    num_classes: int | None = None,
    seed: int = 0,
    merge: bool = True,
    root=None,
    download: bool = False,
) -> Federation:
    """A federation of ``num_clusters * clients_per_cluster`` clients in clusters that differ by ``shift``.

    Args:
        data: a dataset name for :func:`~fedlearn_edu.data.load_dataset` (its official
            train and test splits are pooled), or ``(x, y)`` tensors with images
            ``[n, C, H, W]`` when covariate shift is used.
        shift: ``"label"``, ``"covariate"``, ``"concept"``, a ``+``-joined combination, or
            ``"combined"`` (all three). ``"none"`` gives clusters that do not differ.
        num_clusters: K.
        clients_per_cluster: clients in each cluster; client ``i`` belongs to cluster
            ``i // clients_per_cluster``.
        samples_per_client: samples each client holds before its local train/test split
            (the sparsity knob). ``None``: as many as the data allow, the same for every client.
        classes_per_cluster: label shift -- classes each cluster holds (see
            :func:`label_shift_classes`).
        class_subsets: label shift -- the clusters' class lists, given explicitly instead.
        angles: covariate shift -- rotation (degrees) of each cluster; default ``360 k / K``
            (0, 90, 180, 270 for four clusters).
        permutations: concept shift -- label permutation of each cluster; default
            :func:`concept_permutations`.
        test_fraction: share of every client's samples held out as its local test split.
        test_samples: if given, every client's local test split holds exactly this many
            samples (drawn like its training samples), ``samples_per_client`` then counts the
            *training* samples only, and ``test_fraction`` is ignored. Use it to shrink the
            training sets while keeping the accuracy estimates equally precise.
        num_classes: size of the label space for ``(x, y)`` data (default ``y.max() + 1``).
        seed: seeds the class subsets, permutations and the sampling.
        merge: for a dataset name, pool the official train and test splits (default); with
            ``False`` only the train split is dealt, and the test split
            (``load_dataset(name)[1]``) stays free as public data, e.g. for a reference
            fingerprint.
        root: passed to :func:`~fedlearn_edu.data.load_dataset`.
        download: passed to :func:`~fedlearn_edu.data.load_dataset`.

    Returns:
        A :class:`Federation`; ``federation[i].info`` holds ``cluster``, ``classes``, ``angle``,
        ``permutation`` and ``shift``.

    Example:
        >>> fed = shifted_federation("digits", "label+concept", num_clusters=4, clients_per_cluster=3, seed=0)
        >>> fed.num_clients, [c.info["cluster"] for c in fed][:4]
        (12, [0, 0, 0, 1])
    """
    kinds = parse_shift(shift)
    k = check_int(num_clusters, "num_clusters", 1)
    per = check_int(clients_per_cluster, "clients_per_cluster", 1)
    check_range(test_fraction, "test_fraction", 0, 1, high_open=True)
    x, y, c, dname = _load_pool(data, num_classes, root, download, merge)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= c):
        raise ValueError(f"labels must lie in [0, {c - 1}].")
    rng = np.random.default_rng(seed)
    subsets, rot, perms = _cluster_shifts(
        kinds, x, c, k, classes_per_cluster, class_subsets, angles, permutations, seed
    )
    cluster_of = np.repeat(np.arange(k), per)
    n_test_fixed = None if test_samples is None else check_int(test_samples, "test_samples", 1)
    class_pool, quotas = _class_quotas(y, c, subsets, cluster_of, samples_per_client, n_test_fixed, rng)
    clients = _deal(
        x, y, class_pool, quotas, cluster_of, (subsets, rot, perms), kinds, test_fraction, n_test_fixed, rng
    )
    name = f"{dname}, {'+'.join(kinds) or 'no'} shift, {k} clusters x {per} clients"
    return Federation(clients, c, name)


def cluster_ids(federation: Federation) -> np.ndarray:
    """``ndarray[N]``: the true cluster of every client (``client.info["cluster"]``).

    Args:
        federation: clients with ``info["cluster"]``.

    Returns:
        ``ndarray[N]`` of int64.

    Raises:
        ValueError: a client without ``info["cluster"]``.
    """
    try:
        return np.array([int(cl.info["cluster"]) for cl in federation], dtype=np.int64)
    except KeyError:
        raise ValueError(
            "These clients carry no 'cluster' in their info; build the federation "
            "with shifted_federation (or set client.info['cluster'])."
        ) from None


def appearance_shift(
    federation: Federation,
    *,
    contrast: Sequence[float] | None = None,
    blur: Sequence[float] | None = None,
    noise: Sequence[float] | None = None,
    seed: int = 0,
) -> Federation:
    """Covariate shift the PCA fingerprint *can* see: per-cluster changes of how images look.

    Quarter turns and relabellings are orthogonal maps, to which the fingerprint is blind
    (chapter 7). The changes here are not: cluster ``k`` gets its own

    * ``contrast[k]`` -- ``x -> mean + c_k (x - mean)`` per image (scales the pixel variance
      by ``c_k**2`` against the unchanged label block),
    * ``blur[k]`` -- a Gaussian blur of standard deviation ``blur[k]`` pixels (a
      non-orthogonal linear map: it damps the small-scale directions), ``0`` for none,
    * ``noise[k]`` -- additive Gaussian pixel noise of that standard deviation (adds
      ``noise[k]**2`` to every pixel variance), drawn from ``seed`` and the client index,

    applied in that order to the training and the test inputs of every client of the cluster.

    Args:
        federation: clients with ``info["cluster"]`` (e.g. from :func:`shifted_federation`)
            and image inputs ``[n, C, H, W]``. It is not modified.
        contrast: one contrast factor ``c_k > 0`` per cluster, or ``None`` to leave it alone.
        blur: one blur standard deviation (pixels, >= 0) per cluster, or ``None``.
        noise: one noise standard deviation (>= 0) per cluster, or ``None``.
        seed: seeds the noise.

    Returns:
        A new :class:`Federation`; each client's ``info`` also records ``contrast``,
        ``blur`` and ``noise``.

    Example:
        >>> fed = shifted_federation("digits", "none", num_clusters=2, clients_per_cluster=2, seed=0)
        >>> shifted = appearance_shift(fed, blur=[0.0, 1.0], noise=[0.0, 0.1])
        >>> [c.info["blur"] for c in shifted]
        [0.0, 0.0, 1.0, 1.0]
    """
    clusters = cluster_ids(federation)
    k = int(clusters.max()) + 1 if clusters.size else 0
    values = {}
    for name, given, low, default in (
        ("contrast", contrast, 0.0, 1.0),
        ("blur", blur, 0.0, 0.0),
        ("noise", noise, 0.0, 0.0),
    ):
        if given is None:
            values[name] = [default] * k
            continue
        vals = [float(v) for v in given]
        if len(vals) != k:
            raise ValueError(f"{name} needs one value per cluster ({k}); got {len(vals)}.")
        if any(not math.isfinite(v) or v < low or (name == "contrast" and v == 0.0) for v in vals):
            raise ValueError(f"{name} values must be finite and {'> 0' if name == 'contrast' else '>= 0'}; got {vals}.")
        values[name] = vals

    def look(x: Tensor, j: int, g: torch.Generator) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"appearance_shift needs images shaped [n, C, H, W]; got {tuple(x.shape)}.")
        x = x.clone()
        c, sigma, s = values["contrast"][j], values["blur"][j], values["noise"][j]
        if c != 1.0:
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x = mean + c * (x - mean)
        if sigma > 0:
            r = max(1, math.ceil(2 * sigma))
            t = torch.arange(-r, r + 1, dtype=x.dtype)
            w = torch.exp(-0.5 * (t / sigma) ** 2)
            w = w / w.sum()
            ch = x.shape[1]
            x = torch.nn.functional.conv2d(x, w.view(1, 1, -1, 1).repeat(ch, 1, 1, 1), padding=(r, 0), groups=ch)
            x = torch.nn.functional.conv2d(x, w.view(1, 1, 1, -1).repeat(ch, 1, 1, 1), padding=(0, r), groups=ch)
        if s > 0:
            x = x + s * torch.randn(x.shape, generator=g, dtype=x.dtype)
        return x

    clients = []
    for i, (client, j) in enumerate(zip(federation, clusters)):
        g = torch.Generator().manual_seed(int(seed) * 100_003 + i)
        info = {**client.info, **{name: values[name][j] for name in values}}
        clients.append(
            ClientData(
                look(client.train_x, j, g),
                client.train_y.clone(),
                look(client.test_x, j, g),
                client.test_y.clone(),
                info,
            )
        )
    return Federation(clients, federation.num_classes, f"{federation.name}, appearance shift")

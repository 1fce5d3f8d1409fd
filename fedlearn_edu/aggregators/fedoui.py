"""FedOUI's server-side weighting, and the FedAlign baseline: pure functions of per-client values.

FedOUI (Fernandez-Hernandez et al., 2026). Each selected client k reports the OUI
``o_k`` of its trained model (see :mod:`fedlearn_edu.signals.oui`). The server

1. fits a Beta distribution to the round's OUI values (:func:`fit_beta`),
2. scores each client by how central its OUI is under the fit,
   ``s_k = 2 min(F(o_k), 1 - F(o_k))`` with F the fitted CDF (:func:`fedoui_scores`),
3. weighs ``w_k ∝ n_k (eps + s_k)`` (:func:`fedoui_weights`) and applies
   ``theta <- theta + sum_k w_k Delta_k`` with ``Delta_k = theta_k - theta_t``.

FedAlign (the baseline of the FedOUI paper): ``w_k ∝ n_k (max(cos(Delta_k, Delta_bar), 0) + eps)``
with ``Delta_bar`` the size-weighted mean update (:func:`fedalign_weights`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import Tensor

from ..checks import Updates, as_vector, check_positive, check_range, check_updates, check_weights

__all__ = [
    "fit_beta",
    "beta_moments",
    "empirical_rank_scores",
    "fedoui_scores",
    "fedoui_weights",
    "fedalign_weights",
    "FIT_CLIP",
    "CDF_CLIP",
]

FIT_CLIP = 1e-3
"""OUI values are clipped to ``[FIT_CLIP, 1 - FIT_CLIP]`` before the Beta fit (authors' code)."""
CDF_CLIP = 1e-4
"""OUI values are clipped to ``[CDF_CLIP, 1 - CDF_CLIP]`` before the fitted CDF is evaluated."""


def _as_unit_values(values, what: str = "oui_values") -> np.ndarray:
    """Validate a 1-D vector of numbers in [0, 1]; return float64 NumPy."""
    arr = as_vector(values, what, "Tensor[m], one value per client", "m = 0, select at least one client", np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what}[{i}] (client {i}) is {arr[i]}; OUI values must be finite numbers in [0, 1].")
    out = (arr < 0) | (arr > 1)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise ValueError(
            f"{what}[{i}] (client {i}) = {arr[i]:g} lies outside [0, 1]; OUI is a fraction "
            "(see fedlearn_edu.signals.oui)."
        )
    return arr


def _like(values, arr: np.ndarray) -> Tensor:
    """A tensor from ``arr`` on ``values``' device, in its float dtype (default dtype otherwise)."""
    if isinstance(values, Tensor):
        dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
        return torch.as_tensor(arr, dtype=dtype, device=values.device)
    return torch.as_tensor(arr, dtype=torch.get_default_dtype())


def _real(value, name: str) -> float:
    """A real number (NaN and Inf allowed: the callers treat them), else ``TypeError`` naming it."""
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise TypeError(f"{name} must be a real number, got {value!r}.")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}.") from None


def beta_moments(mean: float, var: float) -> tuple[float, float]:
    """Method-of-moments Beta parameters from a mean and a variance.

    A Beta(alpha, beta) has mean ``m = alpha / (alpha + beta)`` and variance
    ``v = m (1 - m) / (alpha + beta + 1)``; solving, ``c = alpha + beta = m (1 - m) / v - 1``,
    ``alpha = m c``, ``beta = (1 - m) c``. Valid only when ``0 < m < 1`` and ``0 < v < m (1 - m)``.

    Args:
        mean: the sample mean ``m``.
        var: the sample variance ``v``.

    Returns:
        ``(alpha, beta)``; NaN for both when the moments admit no Beta distribution.

    Example:
        >>> a, b = beta_moments(0.25, 0.25 * 0.75 / 11)   # Beta(2.5, 7.5) has these moments
        >>> round(a, 6), round(b, 6)
        (2.5, 7.5)
    """
    mean, var = _real(mean, "mean"), _real(var, "var")
    if not (math.isfinite(mean) and math.isfinite(var)) or var <= 0 or not 0 < mean < 1:
        return math.nan, math.nan
    c = mean * (1.0 - mean) / var - 1.0
    if not math.isfinite(c) or c <= 0:
        return math.nan, math.nan
    return max(mean * c, 1e-6), max((1.0 - mean) * c, 1e-6)


def fit_beta(oui_values, clip: float = FIT_CLIP) -> tuple[float, float, str]:
    """Fit ``Beta(alpha, beta)`` to one round's OUI values, with the authors' fallbacks.

    1. ``"moments"``: clip to ``[clip, 1 - clip]``, ``m = mean``, ``v = var(ddof=1)``,
       ``c = m (1 - m) / v - 1``, ``alpha = m c``, ``beta = (1 - m) c`` (see :func:`beta_moments`).
       Invalid when m < 2 values, all clipped values are equal (``v = 0``, tested exactly: their
       float variance may round to 1e-34), ``c <= 0`` (``v >= m (1 - m)``: more spread than
       any Beta with this mean allows) or anything is non-finite.
    2. ``"mle"``: maximum likelihood, ``scipy.stats.beta.fit(x, floc=0, fscale=1)`` on the
       clipped values. Skipped when m < 2 or all clipped values are equal (the Beta
       likelihood then grows without bound as ``alpha + beta -> inf``: no maximiser);
       failed when SciPy raises or returns non-finite / non-positive parameters.
    3. ``"empirical"``: no distribution; :func:`fedoui_scores` then uses the rank score of
       :func:`empirical_rank_scores`. ``alpha`` and ``beta`` are NaN.

    Args:
        oui_values: ``Tensor[m]`` (or array-like) of OUI values in ``[0, 1]``.
        clip: clipping margin before fitting (1e-3 in the authors' code).

    Returns:
        ``(alpha, beta, method)`` with ``method`` in ``{"moments", "mle", "empirical"}``.

    Raises:
        ValueError: not 1-D, empty, NaN/Inf, or a value outside ``[0, 1]``.

    Example:
        >>> alpha, beta, method = fit_beta(torch.tensor([0.1265, 0.2573, 0.3101, 0.3179, 0.3716]))
        >>> round(alpha, 2), round(beta, 2), method      # the authors' worked example
        (6.1, 15.94, 'moments')
    """
    x = _as_unit_values(oui_values)
    clip = check_range(clip, "clip", 0, 0.5, high_open=True)
    x = np.clip(x, clip, 1.0 - clip)
    if x.size < 2 or np.ptp(x) == 0:  # equal values: v = 0 (their float variance may round to 1e-34)
        return math.nan, math.nan, "empirical"
    alpha, beta = beta_moments(float(x.mean()), float(x.var(ddof=1)))
    if math.isfinite(alpha) and math.isfinite(beta):
        return alpha, beta, "moments"
    from scipy import stats

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            alpha, beta, _, _ = stats.beta.fit(x, floc=0.0, fscale=1.0)
    except Exception:  # SciPy's solver errors (FitSolverError, FitError, ...)
        alpha, beta = math.nan, math.nan
    alpha, beta = float(alpha), float(beta)
    if math.isfinite(alpha) and math.isfinite(beta) and alpha > 0 and beta > 0:
        return alpha, beta, "mle"
    return math.nan, math.nan, "empirical"


def empirical_rank_scores(oui_values) -> Tensor:
    """Distribution-free centrality: ``2 min(r_k / (m + 1), 1 - r_k / (m + 1))``.

    ``r_k`` is the rank of ``o_k`` among the m values (1 = smallest; ties get their
    average rank). The empirical CDF stands in for the fitted one.

    Args:
        oui_values: ``Tensor[m]`` (or a sequence) of OUI values in [0, 1].

    Returns:
        ``Tensor[m]`` in ``(0, 1]``.

    Example:
        >>> empirical_rank_scores(torch.tensor([0.1, 0.2, 0.3]))
        tensor([0.5000, 1.0000, 0.5000])
    """
    from scipy import stats

    x = _as_unit_values(oui_values)
    p = stats.rankdata(x, method="average") / (x.size + 1.0)
    return _like(oui_values, 2.0 * np.minimum(p, 1.0 - p))


def scores_and_fit(oui_values, clip: float = FIT_CLIP):
    """:func:`fedoui_scores` together with the fit behind them (for strategies' diagnostics).

    Args:
        oui_values: ``Tensor[m]`` OUI values in ``[0, 1]``.
        clip: as in :func:`fit_beta`.

    Returns:
        ``(scores: Tensor[m], alpha, beta, method)``; ``method`` is ``"empirical"`` when
        the Beta fit was not usable.
    """
    x = _as_unit_values(oui_values)
    alpha, beta, method = fit_beta(x, clip=clip)
    if method != "empirical":
        from scipy import stats

        cdf = stats.beta.cdf(np.clip(x, CDF_CLIP, 1.0 - CDF_CLIP), alpha, beta)
        scores = 2.0 * np.minimum(cdf, 1.0 - cdf)
        if np.all(np.isfinite(scores)):
            return _like(oui_values, scores), alpha, beta, method
        alpha, beta, method = math.nan, math.nan, "empirical"
    return empirical_rank_scores(oui_values), alpha, beta, method


def fedoui_scores(oui_values, clip: float = FIT_CLIP) -> Tensor:
    """FedOUI's structural score of each client: ``s_k = 2 min(F(o_k), 1 - F(o_k))``.

    ``F`` is the CDF of the Beta fitted by :func:`fit_beta`, evaluated at ``o_k`` clipped to
    ``[1e-4, 1 - 1e-4]``. A client at the fit's median scores 1, one in either tail scores
    near 0. When :func:`fit_beta` falls back to ``"empirical"`` (or the CDF is not finite),
    the scores are :func:`empirical_rank_scores`.

    Args:
        oui_values: ``Tensor[m]`` OUI values in ``[0, 1]``.
        clip: clipping margin of the fit.

    Returns:
        ``Tensor[m]`` in ``[0, 1]``.

    Example:
        >>> s = fedoui_scores(torch.tensor([0.1265, 0.2573, 0.3101, 0.3179, 0.3716], dtype=torch.float64))
        >>> round(float(s[1]), 3)     # the authors' worked example: OUI 0.257 -> s = 0.895
        0.895
    """
    return scores_and_fit(oui_values, clip)[0]


def fedoui_weights(
    oui_values,
    num_samples,
    eps: float = 1e-3,
    size_power: float = 1.0,
    score_power: float = 1.0,
    clip: float = FIT_CLIP,
) -> Tensor:
    """FedOUI's aggregation weights ``w_k ∝ n_k^a (eps + s_k)^b``, normalised to sum to 1.

    ``s_k`` from :func:`fedoui_scores`; ``a = size_power``, ``b = score_power`` (both 1 in
    the paper). ``score_power = 0`` gives FedAvg's ``n_k / sum_j n_j``. Every client keeps a
    positive weight (``eps > 0``): atypical clients are softened, never dropped.
    Aggregate with ``fedlearn_edu.aggregators.fedavg(deltas, w)``.

    Args:
        oui_values: ``Tensor[m]`` OUI values in ``[0, 1]``.
        num_samples: ``Tensor[m]`` training-set sizes ``n_k`` (> 0).
        eps: floor added to the score (1e-3).
        size_power: the exponent a of the sample counts.
        score_power: the exponent b of the scores.
        clip: clipping margin of the Beta fit.

    Returns:
        ``Tensor[m]``, positive, summing to 1.

    Example:
        >>> o = torch.tensor([0.1265, 0.2573, 0.3101, 0.3179, 0.3716], dtype=torch.float64)
        >>> w = fedoui_weights(o, torch.tensor([210, 226, 66, 40, 17]))
        >>> [round(v, 3) for v in w.tolist()]
        [0.054, 0.689, 0.153, 0.085, 0.018]
    """
    eps = check_positive(eps, "eps")  # it keeps every weight positive
    size_power = check_positive(size_power, "size_power", allow_zero=True)
    score_power = check_positive(score_power, "score_power", allow_zero=True)
    return weights_from_scores(fedoui_scores(oui_values, clip), num_samples, eps, size_power, score_power)


def weights_from_scores(
    scores: Tensor, num_samples, eps: float, size_power: float = 1.0, score_power: float = 1.0
) -> Tensor:
    """Normalised weights ``n_k^size_power (eps + s_k)^score_power`` from ready scores.

    Args:
        scores: ``Tensor[m]`` structural scores.
        num_samples: ``Tensor[m]`` positive client sizes.
        eps: floor added to every score.
        size_power: exponent of the sizes.
        score_power: exponent of the scores.

    Returns:
        ``Tensor[m]`` summing to 1, like ``scores``.
    """
    n = check_weights(num_samples, scores.shape[0], "num_samples").cpu().to(torch.float64)
    if bool((n <= 0).any()):
        i = int((n <= 0).nonzero()[0])
        raise ValueError(f"num_samples[{i}] (client {i}) is {n[i].item():g}; every client needs n_k > 0.")
    w = n**size_power * (eps + scores.cpu().to(torch.float64)) ** score_power
    return (w / w.sum()).to(dtype=scores.dtype, device=scores.device)


def fedalign_weights(deltas: Updates, num_samples, eps: float = 1e-3, *, check: bool = True) -> Tensor:
    """FedAlign's weights: ``w_k ∝ n_k (max(cos(Delta_k, Delta_bar), 0) + eps)``, summing to 1.

    ``Delta_bar = sum_k p_k Delta_k`` with ``p_k = n_k / sum_j n_j`` (FedAvg's aggregate).
    A client whose update points away from the consensus keeps only ``eps`` of its size
    weight. A zero update (or a zero mean) has cosine 0.

    Args:
        deltas: client updates ``Delta_k = theta_k - theta_t``: ``Tensor[m, d]`` or dict of
            ``Tensor[m, ...]`` (the whole model is flattened into one vector per client).
        num_samples: ``Tensor[m]`` training-set sizes (> 0).
        eps: floor added to the clipped cosine.
        check: scan ``deltas`` for NaN/Inf (``False``: the caller has, e.g. the round driver).

    Returns:
        ``Tensor[m]``, positive, summing to 1 (float64; float32 on MPS), on the deltas' device.

    Example:
        >>> d = torch.tensor([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0]])
        >>> w = fedalign_weights(d, torch.tensor([1, 1, 1]))
        >>> bool(w[2] < 0.01)
        True
    """
    eps = check_positive(eps, "eps")
    m = check_updates(deltas, "deltas", finite=check)
    n = check_weights(num_samples, m, "num_samples").cpu().to(torch.float64)
    if bool((n <= 0).any()):
        i = int((n <= 0).nonzero()[0])
        raise ValueError(f"num_samples[{i}] (client {i}) is {n[i].item():g}; every client needs n_k > 0.")
    first = deltas if isinstance(deltas, Tensor) else next(iter(deltas.values()))
    dtype = torch.float32 if first.device.type == "mps" else torch.float64  # MPS has no float64
    if isinstance(deltas, Tensor):
        flat = deltas.to(dtype)
    else:
        flat = torch.cat([v.reshape(m, -1).to(dtype) for v in deltas.values()], dim=1)
    n = n.to(device=flat.device, dtype=dtype)
    mean = (n / n.sum()) @ flat
    norms = flat.norm(dim=1) * mean.norm()
    cos = torch.where(
        norms > 0, (flat @ mean) / torch.where(norms > 0, norms, torch.ones_like(norms)), torch.zeros_like(norms)
    ).clamp(-1.0, 1.0)
    w = n * (cos.clamp(min=0.0) + eps)
    if not bool(torch.isfinite(w.sum())):  # n * eps overflows: the same ratios, divided by eps
        w = n * (cos.clamp(min=0.0) / eps + 1.0)
    return w / w.sum()

"""Client fingerprints (:mod:`fedlearn_edu.signals.fingerprint`): the PCA fingerprint against scikit-learn,
its invariances, padding and errors, the random projection and the reference fingerprint.

How the conditional model is conditioned on them is tested in tests/test_conditional.py.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.decomposition import PCA

from fedlearn_edu.data import permute_labels, rotate_images
from fedlearn_edu.signals import (
    RandomProjection,
    label_encoding_matrix,
    pca_fingerprint,
    reference_fingerprint,
)


def _data(n, d, c, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    return x, y


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 40), d=st.integers(1, 30), c=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_fingerprint_equals_sklearn_explained_variance(n, d, c, seed):
    x, y = _data(n, d, c, seed)
    a = torch.cat([x, torch.eye(c, dtype=torch.float64)[y]], 1).numpy()
    k = min(n, d + c)
    pca = PCA(n_components=k, svd_solver="full").fit(a)
    raw = pca_fingerprint(x, y, c, num_eigenvalues=k, normalize=None)
    np.testing.assert_allclose(raw.numpy(), pca.explained_variance_, rtol=1e-7, atol=1e-9)
    ratio = pca_fingerprint(x, y, c, num_eigenvalues=k, normalize="trace")
    if pca.explained_variance_.sum() > 1e-9:
        np.testing.assert_allclose(ratio.numpy(), pca.explained_variance_ratio_, rtol=1e-6, atol=1e-9)


def test_fingerprint_both_gram_paths_match_numpy():
    # n > p uses the p x p Gram matrix, n < p the n x n one: both equal eigvalsh of the covariance
    for n, d in ((200, 12), (15, 300)):
        x, y = _data(n, d, 5, 1)
        a = np.concatenate([x.numpy(), np.eye(5)[y.numpy()]], 1)
        ev = np.sort(np.linalg.eigvalsh(np.cov(a, rowvar=False)))[::-1]
        got = pca_fingerprint(x, y, 5, num_eigenvalues=10, normalize=None).numpy()
        np.testing.assert_allclose(got, np.clip(ev[:10], 0, None), rtol=1e-8, atol=1e-10)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(3, 30), d=st.integers(2, 12), seed=st.integers(0, 10_000))
def test_fingerprint_invariant_to_orthogonal_map_and_sample_order(n, d, seed):
    x, y = _data(n, d, 4, seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    s = pca_fingerprint(x, y, 4, num_eigenvalues=8)
    rotated = pca_fingerprint(x, y, 4, num_eigenvalues=8, feature_map=lambda f: f.reshape(len(f), -1) @ q.T)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))
    shuffled = pca_fingerprint(x[perm], y[perm], 4, num_eigenvalues=8)
    torch.testing.assert_close(rotated, s, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(shuffled, s, rtol=1e-9, atol=1e-12)
    # a non-orthogonal map (a scaling) does change it
    scaled = pca_fingerprint(
        x,
        y,
        4,
        num_eigenvalues=8,
        normalize=None,
        feature_map=lambda f: f.reshape(len(f), -1) * torch.linspace(0.1, 3, d, dtype=f.dtype),
    )
    assert not torch.allclose(scaled, pca_fingerprint(x, y, 4, num_eigenvalues=8, normalize=None))


def test_rotations_and_relabellings_are_invisible_with_onehot_but_not_with_graded_codes():
    x = torch.rand(60, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    y = torch.arange(60) % 5
    s = pca_fingerprint(x, y, 5)
    for angle in (90, 180, 270):  # a quarter turn permutes the pixels: an orthogonal map
        torch.testing.assert_close(pca_fingerprint(rotate_images(x, angle), y, 5), s)
    perm = [3, 0, 4, 1, 2]
    y_perm = permute_labels(y, perm)
    torch.testing.assert_close(pca_fingerprint(x, y_perm, 5), s)
    g = pca_fingerprint(x, y, 5, label_encoding="graded", label_scale=3.0)
    g_perm = pca_fingerprint(x, y_perm, 5, label_encoding="graded", label_scale=3.0)
    assert (g - g_perm).abs().max() > 1e-4


def test_fingerprint_padding_order_and_normalisation():
    x, y = _data(3, 2, 2, 0)  # p = 4 columns, rank <= n - 1 = 2
    s = pca_fingerprint(x, y, 2, num_eigenvalues=32, normalize=None)
    assert s.shape == (32,) and s.dtype == torch.float64
    assert bool((s[2:] == 0).all()) and bool((s[:2] > 0).all())
    assert bool((s[:-1] >= s[1:]).all())
    t = pca_fingerprint(x, y, 2, num_eigenvalues=32)
    torch.testing.assert_close(t.sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(t, s / s.sum())
    # constant data: zero variance, zero fingerprint (no division by zero)
    z = pca_fingerprint(torch.ones(5, 3), torch.zeros(5, dtype=torch.long), 3, num_eigenvalues=4)
    assert bool((z == 0).all())


def test_fingerprint_bad_inputs_raise_clear_errors():
    x, y = _data(10, 4, 3, 0)
    with pytest.raises(ValueError, match="at least 2 samples"):
        pca_fingerprint(x[:1], y[:1], 3)
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        pca_fingerprint(x, torch.full((10,), 3), 3)
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        pca_fingerprint(x, torch.full((10,), -1), 3)
    bad = x.clone()
    bad[4, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf .*sample 4"):
        pca_fingerprint(bad, y, 3)
    with pytest.raises(ValueError, match="one per sample"):
        pca_fingerprint(x, y[:5], 3)
    with pytest.raises(ValueError, match="num_eigenvalues"):
        pca_fingerprint(x, y, 3, num_eigenvalues=0)
    with pytest.raises(ValueError, match="normalize"):
        pca_fingerprint(x, y, 3, normalize="max")
    with pytest.raises(ValueError, match="label_encoding"):
        pca_fingerprint(x, y, 3, label_encoding="binary")
    with pytest.raises(ValueError, match="non-integer"):
        pca_fingerprint(x, y.double() + 0.5, 3)


def test_random_projection_and_reference_fingerprint():
    phi = RandomProjection(48, 8, seed=3)
    x = torch.rand(20, 3, 4, 4)
    out = phi(x)
    assert out.shape == (20, 8)
    torch.testing.assert_close(RandomProjection(48, 8, seed=3)(x), out)
    assert not torch.allclose(RandomProjection(48, 8, seed=4)(x), out)
    with pytest.raises(ValueError, match="48"):
        phi(torch.rand(2, 10))
    y = torch.arange(20) % 4
    s = pca_fingerprint(x, y, 4, num_eigenvalues=6, feature_map=phi)
    assert s.shape == (6,)
    ref = reference_fingerprint(x, y, 4, sample_size=10, num_draws=3, seed=0, num_eigenvalues=6)
    g = torch.Generator().manual_seed(0)
    draws = [torch.randperm(20, generator=g)[:10] for _ in range(3)]
    expected = torch.stack([pca_fingerprint(x[i], y[i], 4, num_eigenvalues=6) for i in draws]).mean(0)
    torch.testing.assert_close(ref, expected)
    assert label_encoding_matrix(4, "ordinal").shape == (4, 1)

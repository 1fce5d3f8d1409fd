"""The shifts (:mod:`fedlearn_edu.data.shifts`): appearance_shift's per-cluster contrast, blur and noise
against NumPy/SciPy; concept shifts that cannot exist are refused at once, without a hang."""

import threading

import numpy as np
import pytest
import torch
from scipy import ndimage

from fedlearn_edu.data import concept_permutations, shifted_federation
from fedlearn_edu.data.shifts import appearance_shift
from fedlearn_edu.signals import client_fingerprints


@pytest.fixture(scope="module")
def unshifted():
    """Two clusters of two clients that differ in nothing until appearance_shift changes them."""
    return shifted_federation("digits", "none", num_clusters=2, clients_per_cluster=2, samples_per_client=40, seed=0)


def test_blur_is_a_gaussian_filter(unshifted):
    out = appearance_shift(unshifted, blur=[0.0, 1.0])
    x = unshifted[2].train_x.double().numpy()
    sigma = 1.0
    expected = ndimage.gaussian_filter(x, sigma=(0, 0, sigma, sigma), mode="constant", cval=0.0, truncate=2.0)
    np.testing.assert_allclose(out[2].train_x.numpy(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[0].train_x, unshifted[0].train_x)  # cluster 0 untouched


def test_contrast_keeps_the_mean_and_scales_the_spread(unshifted):
    out = appearance_shift(unshifted, contrast=[1.0, 0.5])
    x, y = unshifted[3].test_x.double(), out[3].test_x.double()
    torch.testing.assert_close(y.mean(dim=(1, 2, 3)), x.mean(dim=(1, 2, 3)))
    torch.testing.assert_close(y.std(dim=(1, 2, 3)), 0.5 * x.std(dim=(1, 2, 3)))


def test_noise_has_the_requested_level_and_is_seeded(unshifted):
    a = appearance_shift(unshifted, noise=[0.0, 0.2], seed=1)
    b = appearance_shift(unshifted, noise=[0.0, 0.2], seed=1)
    diff = (a[2].train_x - unshifted[2].train_x).double()
    assert abs(float(diff.std()) - 0.2) < 0.02
    torch.testing.assert_close(a[2].train_x, b[2].train_x)
    assert a[2].info["noise"] == 0.2 and a[0].info["noise"] == 0.0


def test_the_fingerprint_sees_it(unshifted):
    s0 = client_fingerprints(unshifted, 16)
    s1 = client_fingerprints(appearance_shift(unshifted, blur=[0.0, 1.0]), 16)
    assert float((s1[2:] - s0[2:]).abs().max()) > 1e-3  # blur changes the spectrum
    torch.testing.assert_close(s1[:2], s0[:2])


def test_the_caller_federation_is_not_modified_and_bad_values_are_refused(unshifted):
    before = unshifted[2].train_x.clone()
    appearance_shift(unshifted, contrast=[2.0, 0.5], blur=[1.0, 1.0], noise=[0.1, 0.1])
    torch.testing.assert_close(unshifted[2].train_x, before)
    with pytest.raises(ValueError, match="one value per cluster"):
        appearance_shift(unshifted, blur=[1.0])
    with pytest.raises(ValueError, match="> 0"):
        appearance_shift(unshifted, contrast=[1.0, 0.0])
    with pytest.raises(ValueError, match=">= 0"):
        appearance_shift(unshifted, noise=[0.1, -0.1])


def _returns_within(fn, seconds=20.0):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as err:  # noqa: BLE001 - the test inspects it
            out["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hangs"
    return out


def test_concept_permutations_raises_at_once_when_too_few_exist():
    out = _returns_within(lambda: concept_permutations(3, 4))
    assert isinstance(out.get("error"), ValueError) and "only 2 exist" in str(out["error"])
    assert len(concept_permutations(3, 3)) == 3  # identity + both derangements of 3 classes


def test_shifted_federation_concept_on_two_classes_raises_at_once():
    x = torch.rand(200, 1, 4, 4)
    y = torch.arange(200) % 2
    out = _returns_within(lambda: shifted_federation((x, y), "concept", num_clusters=3, clients_per_cluster=2))
    assert isinstance(out.get("error"), ValueError) and "only 1 exist" in str(out["error"])

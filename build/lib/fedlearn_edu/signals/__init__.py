"""Client signals: quantities computed from a client's model or data that strategies weigh by."""

from .fingerprint import (
    RandomProjection,
    client_fingerprints,
    label_encoding_matrix,
    pca_fingerprint,
    reference_fingerprint,
)
from .loss import global_model_loss
from .oui import (
    activation_counts,
    client_oui,
    hamming_distances,
    oui,
    oui_pairwise,
    penultimate_preactivations,
    probe_batch,
    probe_indices,
)
from .validation_gradients import as_validation_set, validation_gradient_norms, validation_gradients

__all__ = [
    "global_model_loss",
    "validation_gradients",
    "validation_gradient_norms",
    "as_validation_set",
    "oui",
    "oui_pairwise",
    "activation_counts",
    "hamming_distances",
    "penultimate_preactivations",
    "probe_indices",
    "probe_batch",
    "client_oui",
    "pca_fingerprint",
    "client_fingerprints",
    "reference_fingerprint",
    "RandomProjection",
    "label_encoding_matrix",
]

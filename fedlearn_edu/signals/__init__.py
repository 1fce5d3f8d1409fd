"""Client signals: quantities computed from a client's model or data that strategies weigh by."""
from .fingerprint import (RandomProjection, client_fingerprints, label_encoding_matrix, pca_fingerprint,
                          reference_fingerprint)

__all__: list[str] = ["pca_fingerprint", "client_fingerprints", "reference_fingerprint", "RandomProjection", "label_encoding_matrix"]

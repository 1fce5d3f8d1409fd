"""Utilities (:mod:`fedlearn_edu.utils`): the device resolution and derived seeds."""

import pytest
import torch

from fedlearn_edu.utils import derive_seed, resolve_device


def test_resolve_device_and_derive_seed():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in {"cpu", "cuda", "mps"}
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert len({derive_seed(0, t, i) for t in range(10) for i in range(10)}) == 100

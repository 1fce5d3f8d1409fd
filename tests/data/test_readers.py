"""The readers of on-disk formats (:mod:`fedlearn_edu.data.readers`): a crafted CIFAR batch raises
instead of running code."""

import pytest

from fedlearn_edu.data import load_dataset
from tests.data.crafted_cifar import _write_malicious_cifar


def test_a_crafted_cifar_batch_in_a_named_folder_raises_instead_of_running_code(tmp_path):
    marker = tmp_path / "pwned"
    _write_malicious_cifar(tmp_path / "root" / "cifar-10-batches-py", marker)
    with pytest.raises(ValueError, match="refusing to load posix.system|refusing to load"):
        load_dataset("cifar10", root=tmp_path / "root")
    assert not marker.exists()

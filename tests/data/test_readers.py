"""The readers of on-disk formats (:mod:`fedlearn_edu.data.readers`): a crafted CIFAR batch raises
instead of running code; broken IDX files are refused."""

from __future__ import annotations

import struct

import pytest

from fedlearn_edu.data import load_dataset, read_idx
from tests.data.crafted_cifar import _write_malicious_cifar


def test_a_crafted_cifar_batch_in_a_named_folder_raises_instead_of_running_code(tmp_path):
    marker = tmp_path / "pwned"
    _write_malicious_cifar(tmp_path / "root" / "cifar-10-batches-py", marker)
    with pytest.raises(ValueError, match="refusing to load posix.system|refusing to load"):
        load_dataset("cifar10", root=tmp_path / "root")
    assert not marker.exists()


def test_read_idx_rejects_broken_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="holds 3 bytes"):
        read_idx(short)

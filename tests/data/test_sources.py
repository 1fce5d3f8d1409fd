"""Where dataset files are looked for (:mod:`fedlearn_edu.data.sources`): CIFAR only where the user
points, never in the working directory; no folder beside the repository."""

import os

import pytest

from fedlearn_edu.data import load_dataset
from tests.data.crafted_cifar import _write_malicious_cifar


def test_cifar_in_the_working_directory_is_never_unpickled(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    _write_malicious_cifar(tmp_path / "data" / "cifar-10-batches-py", marker)
    with pytest.raises(FileNotFoundError, match="cifar10"):
        load_dataset("cifar10")
    assert not marker.exists()


def test_cifar_is_searched_only_where_the_user_points(tmp_path, monkeypatch):
    from fedlearn_edu.data import sources as src_mod

    monkeypatch.setenv("FEDLEARN_DATA", str(tmp_path / "env"))
    dirs = src_mod.search_dirs("cifar10", tmp_path / "root")
    assert all(str(d).startswith((str(tmp_path / "root"), str(tmp_path / "env"))) for d in dirs)


def test_library_knows_no_shared_folder_beside_the_repository():
    import fedlearn_edu.data as data_pkg

    folder = os.path.dirname(data_pkg.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as fh:
                text = fh.read()
                assert '"shared"' not in text and "/shared/" not in text and "SHARED" not in text, name

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


def test_requests_for_data_sets_beyond_the_bundled_ones_are_logged_where_asked(tmp_path, monkeypatch):
    """``$FEDLEARN_DATA_LOG`` gets a line per request for a data set that is not bundled, found or not
    (the book build reads it to know which chapters depend on the machine's data sets); the bundled
    digits and an unset variable write nothing."""
    import json

    from fedlearn_edu.data.sources import REQUEST_LOG_VAR
    from tests.data.test_datasets import write_tiny_idx_set

    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    monkeypatch.setenv("FEDLEARN_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "logs" / "page.jsonl"
    monkeypatch.setenv(REQUEST_LOG_VAR, str(log))
    load_dataset("digits")
    assert not log.exists()
    with pytest.raises(FileNotFoundError):
        load_dataset("MNIST", root=tmp_path / "empty")
    write_tiny_idx_set(tmp_path / "files" / "mnist", gz=False)
    load_dataset("mnist", root=tmp_path / "files")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [{"dataset": "mnist", "found": False}, {"dataset": "mnist", "found": True}]

    monkeypatch.delenv(REQUEST_LOG_VAR)
    log.unlink()
    with pytest.raises(FileNotFoundError):
        load_dataset("mnist", root=tmp_path / "empty")
    assert not log.exists()

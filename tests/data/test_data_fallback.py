"""dataset_or_digits: the data set asked for when it can be had, else the bundled digits with a note."""

from __future__ import annotations

import pytest

from fedlearn_edu.data import dataset_or_digits, external_validation_set
from fedlearn_edu.data import datasets as ds


def test_digits_is_kept():
    assert dataset_or_digits("digits") == "digits"


def test_missing_files_without_download_fall_back_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDLEARN_DATA", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert dataset_or_digits("mnist", download=False) == "digits"
    out = capsys.readouterr().out
    assert "mnist is not available here" in out and "digits" in out
    x, y = external_validation_set(dataset_or_digits("mnist", download=False), (1, 8, 8), 20)
    assert x.shape == (20, 1, 8, 8) and y.shape == (20,)


def test_failed_download_falls_back(tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(ds, "load_dataset", offline)
    import fedlearn_edu.data.fallback as fb

    monkeypatch.setattr(fb, "load_dataset", offline)
    assert dataset_or_digits("mnist") == "digits"
    assert "name resolution" in capsys.readouterr().out


def test_found_dataset_is_used(tmp_path, monkeypatch):
    import fedlearn_edu.data.fallback as fb

    calls = []
    monkeypatch.setattr(fb, "load_dataset", lambda name, **kw: calls.append((name, kw)))
    assert dataset_or_digits("mnist", root=tmp_path) == "mnist"
    assert calls == [("mnist", {"root": tmp_path, "download": True})]


def test_other_errors_are_not_hidden(monkeypatch):
    import fedlearn_edu.data.fallback as fb

    def bad(*a, **k):
        raise ValueError("unknown dataset 'mnistt'")

    monkeypatch.setattr(fb, "load_dataset", bad)
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_or_digits("mnistt")

"""benchmark.classroom_records: the committed records found, else downloaded (here from a local HTTP server)."""

from __future__ import annotations

import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest

from fedlearn_edu import benchmark
from fedlearn_edu.benchmark import records

COMMITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "classroom"


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No committed records anywhere: no repository copy, no ../benchmarks, no env folder."""
    monkeypatch.setattr(records, "REPO_RECORDS", tmp_path / "no-repo")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.delenv(benchmark.RECORDS_DIR_VAR, raising=False)
    monkeypatch.delenv("FEDLEARN_OFFLINE", raising=False)
    return tmp_path


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/'served' (a thread, stopped afterwards)."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{httpd.server_address[1]}/classroom"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_the_repository_copy_is_found_first(monkeypatch):
    monkeypatch.delenv(benchmark.RECORDS_DIR_VAR, raising=False)
    assert benchmark.classroom_records(download=False).resolve() == COMMITTED.resolve()


def test_the_env_folder_wins(tmp_path, monkeypatch):
    for name in benchmark.RECORD_FILES:
        shutil.copy(COMMITTED / name, tmp_path / name)
    monkeypatch.setenv(benchmark.RECORDS_DIR_VAR, str(tmp_path))
    assert benchmark.classroom_records(download=False) == tmp_path


def test_downloaded_from_the_url_and_read_like_the_committed(nowhere, server, monkeypatch):
    served, url = server
    (served / "classroom").mkdir()
    for name in benchmark.RECORD_FILES:
        shutil.copy(COMMITTED / name, served / "classroom" / name)
    monkeypatch.setenv(benchmark.RECORDS_URL_VAR, url)
    folder = benchmark.classroom_records(root=nowhere / "data")
    assert folder == (nowhere / "data" / "benchmark-classroom").absolute()
    for name in benchmark.RECORD_FILES:
        assert (folder / name).read_bytes() == (COMMITTED / name).read_bytes()
    assert not list(folder.glob(".*tmp"))
    got, ref = benchmark.load(folder), benchmark.load(COMMITTED)
    pd.testing.assert_frame_equal(got.records, ref.records)
    assert got.picks == ref.picks
    # a second call finds the copy: nothing is fetched (the server has nothing now)
    shutil.rmtree(served / "classroom")
    assert benchmark.classroom_records(root=nowhere / "data") == folder


def test_offline_or_no_download_is_a_clear_error(nowhere, monkeypatch):
    monkeypatch.setenv("FEDLEARN_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="FEDLEARN_OFFLINE is set.*raw.githubusercontent.com.*Clone"):
        benchmark.classroom_records(root=nowhere / "data")
    monkeypatch.delenv("FEDLEARN_OFFLINE")
    with pytest.raises(FileNotFoundError, match="download=False"):
        benchmark.classroom_records(root=nowhere / "data", download=False)
    assert not (nowhere / "data").exists()


def test_a_missing_or_broken_file_names_the_url_and_writes_nothing(nowhere, server, monkeypatch):
    served, url = server
    (served / "classroom").mkdir()
    monkeypatch.setenv(benchmark.RECORDS_URL_VAR, url)
    with pytest.raises(ConnectionError, match=f"{url}/records.csv.gz.*404"):
        benchmark.classroom_records(root=nowhere / "data")
    # a gzip CSV without the records' columns (e.g. a wrong file at that address)
    (served / "classroom" / "records.csv.gz").write_bytes(gzip.compress(b"a,b\n1,2\n"))
    with pytest.raises(ValueError, match=f"{url}/records.csv.gz is not a benchmark records.csv.gz.*run_key"):
        benchmark.classroom_records(root=nowhere / "data")
    # an HTML page served instead of the gzip file
    (served / "classroom" / "records.csv.gz").write_bytes(b"<html>Not Found</html>")
    with pytest.raises(ValueError, match="records.csv.gz is not a benchmark"):
        benchmark.classroom_records(root=nowhere / "data")
    assert list((nowhere / "data" / "benchmark-classroom").iterdir()) == []

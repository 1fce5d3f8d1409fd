"""Packaging: ``python -m build`` makes a wheel and an sdist without warnings, with the metadata the
package index shows (SPDX licence, project URLs from ``_config.yml``, one Python floor, one version)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _toml(text: str) -> dict:
    return pytest.importorskip("tomllib", reason="tomllib: Python 3.11+").loads(text)


sys.path.insert(0, str(REPO / "book" / "_ext"))
from reader_copies import book_config  # noqa: E402


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode())


def test_build_has_no_warnings(built_dist):
    lines = [ln for ln in built_dist["log"].splitlines() if re.search(r"warn|deprecat", ln, re.I)]
    assert not lines, "python -m build warned:\n" + "\n".join(lines)


def test_wheel_metadata(built_dist):
    import fedlearn_edu

    meta = _metadata(built_dist["wheel"])
    project = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["Name"] == "fedlearn-edu"
    assert meta["Version"] == fedlearn_edu.__version__
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == project["requires-python"] == ">=3.10"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    cfg = book_config(REPO)
    assert urls["Source"] == cfg["repository_url"]
    assert urls["Issues"] == cfg["repository_url"] + "/issues"
    assert urls["Homepage"] == cfg["site_url"]
    with zipfile.ZipFile(built_dist["wheel"]) as zf:
        names = zf.namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names), names
    assert not [n for n in names if n.startswith(("tests/", "book/", "build/"))]


def test_sdist_builds_the_same_urls(built_dist):
    with tarfile.open(built_dist["sdist"]) as tf:
        names = tf.getnames()
        pkg_info = tf.extractfile(next(n for n in names if n.count("/") == 1 and n.endswith("PKG-INFO"))).read()
    assert any(n.endswith("/_config.yml") for n in names), "setup.py reads the URLs from _config.yml"
    assert b"Project-URL: Source, " + book_config(REPO)["repository_url"].encode() in pkg_info


def test_version_is_written_once():
    project = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project and "version" in project["dynamic"]


def test_git_ignores_build_outputs_and_downloads():
    paths = ["build/lib/x.py", "dist/x.whl", "data/MNIST/raw/x", "book/data/MNIST/raw/x"]
    proc = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    if proc.returncode == 128:
        pytest.skip("not a git checkout")
    assert sorted(proc.stdout.split()) == sorted(paths)

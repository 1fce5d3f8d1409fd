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
    assert "fedlearn_edu/py.typed" in names  # PEP 561: type checkers read the annotations
    description = meta.get_payload()
    assert meta["Description-Content-Type"] == "text/markdown" and "## Quick start" in description
    assert not _relative_links(description), _relative_links(description)


def test_sdist_builds_the_same_urls(built_dist):
    with tarfile.open(built_dist["sdist"]) as tf:
        names = tf.getnames()
        pkg_info = tf.extractfile(next(n for n in names if n.count("/") == 1 and n.endswith("PKG-INFO"))).read()
    assert any(n.endswith("/_config.yml") for n in names), "setup.py reads the URLs from _config.yml"
    assert b"Project-URL: Source, " + book_config(REPO)["repository_url"].encode() in pkg_info


def test_sdist_ships_no_tests_that_cannot_run(built_dist):
    """The tests need the checkout (conftest.py, helpers, the book): the sdist has either all of it or none."""
    with tarfile.open(built_dist["sdist"]) as tf:
        inside = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    assert not [n for n in inside if n.startswith("tests/") or n.split("/")[-1].startswith("test_")], inside
    assert "README.md" in inside and "fedlearn_edu/py.typed" in inside


def test_version_is_written_once():
    project = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project and "version" in project["dynamic"]


def test_git_ignores_build_outputs_and_downloads():
    paths = ["build/lib/x.py", "dist/x.whl", "data/MNIST/raw/x", "book/data/MNIST/raw/x"]
    proc = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    if proc.returncode == 128:
        pytest.skip("not a git checkout")
    assert sorted(proc.stdout.split()) == sorted(paths)


# --------------------------------------------------------------------------- fast checks of the metadata


def _project() -> dict:
    return _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _setup_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fedlearn_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() itself runs only under __main__
    return module


def _relative_links(markdown: str) -> list[str]:
    targets = re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)\)", markdown)
    return [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|#", t)]


def test_the_long_description_has_absolute_links():
    setup = _setup_module()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    repo = book_config(REPO)["repository_url"]
    assert _relative_links(readme), "README.md has relative links: this test checks they are rewritten"
    described = setup.absolute_links(readme, repo)
    assert not _relative_links(described), _relative_links(described)
    assert f"]({repo}/blob/main/book/ch01_fedavg.ipynb)" in described and f"]({repo}/blob/main/LICENSE)" in described
    assert setup.absolute_links("![fig](./a.png) [x](#top) [y](https://e.org/z)", "R") == (
        "![fig](R/raw/main/a.png) [x](#top) [y](https://e.org/z)"
    )
    assert "readme" in _project()["dynamic"] and "readme" not in _project()  # setup.py writes it
    assert "include README.md" in (REPO / "MANIFEST.in").read_text(encoding="utf-8")


def test_the_package_is_typed():
    assert (REPO / "fedlearn_edu" / "py.typed").is_file()
    data = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["fedlearn_edu"]
    assert "Typing :: Typed" in _project()["classifiers"]


def test_the_version_classifiers_follow_requires_python():
    floor = tuple(int(p) for p in _project()["requires-python"].removeprefix(">=").split("."))
    versions = [
        tuple(int(p) for p in c.rsplit(" ", 1)[1].split("."))
        for c in _project()["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions and min(versions) == floor, versions
    assert versions == [(3, minor) for minor in range(floor[1], floor[1] + len(versions))], versions  # no gap


def test_dependency_floors():
    """Floors found too low: joblib < 1.5 has no Parallel(initializer=); ipywidgets is the book's, not the package's."""
    from packaging.requirements import Requirement

    deps = {Requirement(d).name: Requirement(d) for d in _project()["dependencies"]}
    assert "ipywidgets" not in deps
    assert not deps["joblib"].specifier.contains("1.4.2") and deps["joblib"].specifier.contains("1.5.0")
    book = {Requirement(d).name: Requirement(d) for d in _project()["optional-dependencies"]["book"]}
    assert book["ipywidgets"].specifier.contains("7.7.1")  # what Colab ships
    used = subprocess.run(["git", "grep", "-l", "ipywidgets", "--", "fedlearn_edu"], cwd=REPO, capture_output=True)
    assert used.returncode in (1, 128) and not used.stdout, "the package imports ipywidgets: make it a dependency again"


def test_citation_file_names_the_book_and_the_package():
    import fedlearn_edu

    yaml = pytest.importorskip("yaml")
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    cfg = book_config(REPO)
    assert cff["cff-version"] == "1.2.0" and cff["message"] and cff["authors"]
    assert cff["type"] == "software" and cff["version"] == fedlearn_edu.__version__
    assert cff["repository-code"] == cfg["repository_url"] and cff["url"] == cfg["site_url"]
    assert set(cff["license"]) == {"MIT", "CC-BY-4.0"}
    book = cff["preferred-citation"]
    assert book["type"] == "book" and book["url"] == cfg["site_url"] and book["license"] == "CC-BY-4.0"


def test_changelog_follows_keep_a_changelog():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections and sections[0] == "Unreleased", sections
    kinds = set(re.findall(r"^### (.+)$", text, re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds

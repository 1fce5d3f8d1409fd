"""Book-level checks.

* The whole book builds offline with Jupyter Book 1.x, warnings as errors
  (``-W -n --keep-going``), executing every chapter; the intro and every
  chapter page exist and show no Python traceback.
* Every chapter notebook under ``book/`` follows the book's conventions: it is
  committed without outputs, it is listed in ``_toc.yml``, and its first code
  cell installs ``fedlearn_edu`` where it is missing (Colab).

The build runs once per test session (the ``built_book`` fixture of conftest.py) into a
temporary directory, so it never touches the working tree's ``_build/``. Its time limit
is ``FEDLEARN_BOOK_TIMEOUT`` seconds (default 3600).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "book"
TRACEBACK = "Traceback (most recent call last)"


# --------------------------------------------------------------------------
# helpers


def _toc_files() -> list[str]:
    """Every ``file:`` entry of ``_toc.yml`` (root first), without suffix."""
    yaml = pytest.importorskip("yaml")
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(f).with_suffix("")) if Path(f).suffix in {".md", ".ipynb"} else f for f in files]


def _book_notebooks() -> list[Path]:
    skip = {"_build", "_static", ".ipynb_checkpoints", ".jupyter_cache"}
    return sorted(p for p in BOOK.rglob("*.ipynb") if not skip.intersection(p.relative_to(BOOK).parts))


def _chapter_docs() -> list[str]:
    """TOC entries that are notebooks (the executed chapters)."""
    return [f for f in _toc_files() if (REPO / f).with_suffix(".ipynb").exists()]


# --------------------------------------------------------------------------
# the build


def test_book_builds_with_warnings_as_errors(built_book: Path):
    assert (built_book / "index.html").is_file()
    assert (built_book / "book" / "intro.html").is_file()


def test_every_toc_page_is_rendered(built_book: Path):
    missing = [f for f in _toc_files() if not (built_book / f"{f}.html").is_file()]
    assert not missing, f"pages listed in _toc.yml but not rendered: {missing}"


@pytest.mark.parametrize("doc", ["book/intro", *_chapter_docs()])
def test_page_has_no_traceback(built_book: Path, doc: str):
    page = built_book / f"{doc}.html"
    assert page.is_file(), f"{page} was not built"
    text = page.read_text(encoding="utf-8")
    assert TRACEBACK not in text, f"{doc}.html shows a Python traceback"


def test_bibliography_is_rendered(built_book: Path):
    text = (built_book / "book" / "bibliography.html").read_text(encoding="utf-8")
    assert "arXiv:2605.21317" in text  # CRAFT


# --------------------------------------------------------------------------
# notebook conventions (no build needed)


def test_book_has_chapters():
    assert _book_notebooks(), "no chapter notebooks under book/"


@pytest.mark.parametrize("path", _book_notebooks(), ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_committed_without_outputs(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = [
        i
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} have outputs or an execution count; "
        "clear them before committing (e.g. `jupyter nbconvert --clear-output --inplace`)"
    )


@pytest.mark.parametrize("path", _book_notebooks(), ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_first_code_cell_installs_package(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cell"
    source = "".join(code[0]["source"]) if isinstance(code[0]["source"], list) else code[0]["source"]
    assert "fedlearn_edu" in source and "pip install" in source, (
        f"{path.name}: the first code cell must install fedlearn_edu where it is missing; write it with\n"
        "    python book/_ext/reader_copies.py --sync-install-cells"
    )


@pytest.mark.parametrize("path", _book_notebooks(), ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_is_in_toc(path: Path):
    doc = str(path.relative_to(REPO).with_suffix(""))
    assert doc in _toc_files(), (
        f"{doc} is not listed in _toc.yml, so the book would not build or publish it (only_build_toc_files: true)"
    )

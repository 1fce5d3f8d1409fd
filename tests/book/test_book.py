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

import html
import json
import re
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


FALLBACK_NOTE = "using scikit-learn's bundled digits instead"  # fedlearn_edu.data.dataset_or_digits prints it


def _mnist_chapters() -> dict[int, str]:
    """``{chapter number: TOC entry}`` of the chapters whose code reads MNIST on the default settings,
    through ``dataset_or_digits`` (MNIST where it is, else the bundled digits)."""
    out = {}
    for doc in _chapter_docs():
        cells = json.loads((REPO / doc).with_suffix(".ipynb").read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        number = re.match(r"ch(\d+)_", Path(doc).name)
        if "dataset_or_digits(" in code and number:
            out[int(number.group(1))] = doc
    return out


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


@pytest.mark.parametrize("doc", list(_mnist_chapters().values()))
def test_mnist_chapters_are_built_on_their_fallback(built_book: Path, doc: str):
    """The tests' build is a newcomer's offline one (tests/conftest.py): no MNIST, no download."""
    text = html.unescape((built_book / f"{doc}.html").read_text(encoding="utf-8"))
    assert "Note: mnist is not available here" in text and FALLBACK_NOTE in text, (
        f"{doc} was built on MNIST: the book build the tests run must see no data set beyond the bundled ones"
    )


def test_bibliography_is_rendered(built_book: Path):
    text = (built_book / "book" / "bibliography.html").read_text(encoding="utf-8")
    assert "arXiv:2605.21317" in text  # CRAFT


# --------------------------------------------------------------------------
# the kernel that executes the chapters


def _release(version: str) -> tuple[int, int]:
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return major, minor


@pytest.mark.parametrize(("version", "release"), [("7.4.0", (7, 4)), ("6.29.5", (6, 29)), ("7.3.0rc1", (7, 3))])
def test_release_reads_major_and_minor(version: str, release: tuple[int, int]):
    assert _release(version) == release


def test_the_kernel_is_not_a_release_that_leaves_requests_unread():
    """ipykernel 7.0-7.3 can leave a shell request unread: the kernel idles, and the build's cell waits
    out its 600 s timeout (ipython/ipykernel#1529, fixed in 7.4.0); 7.0-7.2 also print
    ``ZMQError: Socket operation on non-socket`` while a kernel shuts down (#1518).
    pyproject.toml's book extra excludes them."""
    from importlib.metadata import version

    installed = version("ipykernel")
    assert not (7, 0) <= _release(installed) < (7, 4), (
        f"ipykernel {installed} can strand a cell's request (ipython/ipykernel#1529); "
        'reinstall the book extra: pip install -e ".[book,test,flower]"'
    )


# --------------------------------------------------------------------------
# notebook conventions (no build needed)


def test_book_has_chapters():
    assert _book_notebooks(), "no chapter notebooks under book/"


def _chapter_numbers(sentence: str) -> set[int]:
    """The chapter numbers a sentence names: "chapter 4", "chapters 4 and 6", "(3 and 5)"."""
    lists = re.findall(r"\b[Cc]hapters? ((?:\d+(?:, | and | or )?)+)", sentence)
    lists += re.findall(r"\(((?:\d+(?:, | and | or ))*\d+)\)", sentence)
    return {int(n) for group in lists for n in re.findall(r"\d+", group)}


def test_how_to_run_lists_the_chapters_that_read_mnist():
    """One list in How to run, of the chapters that call ``dataset_or_digits``; no other sentence there
    that speaks of MNIST names another chapter."""
    chapters = set(_mnist_chapters())
    assert chapters, "no chapter reads MNIST through dataset_or_digits: update this test and How to run"
    text = re.sub(r"\s+", " ", (BOOK / "how_to_run.md").read_text(encoding="utf-8"))
    sentences = re.split(r"(?<=[.;:])\s+(?=[A-Z(`])", text)
    lists = [s for s in sentences if re.match(r"Chapters? [\d, and]+ reads? MNIST", s)]
    assert len(lists) == 1, f"How to run should list the chapters that read MNIST in one sentence: {lists}"
    listed = _chapter_numbers(re.match(r"Chapters? [\d, and]+", lists[0]).group(0))
    assert listed == chapters, f"How to run lists chapters {sorted(listed)}; the code: {sorted(chapters)}"
    for sentence in sentences:
        if re.search(r"\bMNIST\b", sentence.replace("Fashion-MNIST", "")):
            named = _chapter_numbers(sentence)
            assert named <= chapters, f"How to run names chapters {sorted(named)} beside MNIST: {sentence!r}"


def test_chapter_numbers_are_read_from_a_sentence():
    assert _chapter_numbers("The chapters that use MNIST (3 and 5) find it") == {3, 5}
    assert _chapter_numbers("Chapters 4 and 6 read MNIST (chapter 4 for x, chapter 6 for y)") == {4, 6}
    assert _chapter_numbers("chapters 1, 2 or 7 and (the 8x8 digits)") == {1, 2, 7}


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

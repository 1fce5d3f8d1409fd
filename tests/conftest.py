"""Shared fixtures: the book, built once per test session; where the data sets are.

The package looks for MNIST where ``FEDLEARN_DATA`` points (it knows no folder beside the
repository). On this project's machines the files live in ``../shared/data``; the tests,
the chapters they execute and the book build they start all see it through the
environment variable set here (``book/conftest.py`` does the same for a chapter run alone
under nbval). A value already set is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = int(os.environ.get("FEDLEARN_BOOK_TIMEOUT", "3600"))
SHARED_DATA = REPO.parent / "shared" / "data"
if SHARED_DATA.is_dir():
    os.environ.setdefault("FEDLEARN_DATA", str(SHARED_DATA))


def pytest_collection_modifyitems(config, items):
    """Mark every item that executes a chapter (nbval) or needs the built book as ``book``."""
    for item in items:
        if item.path.suffix == ".ipynb" or "built_book" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.book)


def _tail(text: str, n: int = 6000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """Build the book into a temporary folder; return its ``_build/html``.

    For quick iterations on the book tests, ``FEDLEARN_BOOK_HTML=_build/html`` reuses an
    existing build instead (CI never sets it).
    """
    if os.environ.get("FEDLEARN_BOOK_HTML"):
        return Path(os.environ["FEDLEARN_BOOK_HTML"]).resolve()
    try:
        import jupyter_book  # noqa: F401
    except ImportError as err:  # pragma: no cover - environment problem
        pytest.fail(f'jupyter-book is not installed ({err}); install the book extras: pip install -e ".[book,test]"')
    out = tmp_path_factory.mktemp("book")
    # `--path-output DIR` writes the HTML to DIR/_build/html.
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
        "build",
        str(REPO),
        "--path-output",
        str(out),
        "-W",
        "-n",
        "--keep-going",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as err:
        output = err.output.decode() if isinstance(err.output, bytes) else (err.output or "")
        pytest.fail(f"book build exceeded {BUILD_TIMEOUT_S} s\n{_tail(output)}")
    html = out / "_build" / "html"
    assert proc.returncode == 0, (
        f"`jupyter-book build . -W -n --keep-going` failed (exit {proc.returncode}):\n{_tail(proc.stdout)}"
    )
    return html

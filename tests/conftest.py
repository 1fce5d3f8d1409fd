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
    """Mark every item that executes a chapter (nbval), needs the built book or builds the package as ``book``."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        heavy = {"built_book", "built_dist", "fresh_venv"}
        if item.path.suffix == ".ipynb" or heavy.intersection(fixtures):
            item.add_marker(pytest.mark.book)


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory) -> dict:
    """``python -m build`` of the repository (sdist, then the wheel from it) into a temporary folder.

    Returns:
        ``{"wheel": Path, "sdist": Path, "log": str}`` (``log``: the build's stdout and stderr).
    """
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"python -m build failed:\n{_tail(proc.stdout)}"
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0], "log": proc.stdout}


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
        pytest.fail(
            f'jupyter-book is not installed ({err}); install the book extras: pip install -e ".[book,test,flower]"'
        )
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
    # MPLBACKEND=Agg, as many servers and CI images export it: the chapters must keep their figures
    # (their set-up cell selects the inline backend), or the build fails on undefined figure labels.
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
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

"""Shared fixtures: the book, built once per test session; where the data sets are; small runs.

The package looks for MNIST where ``FEDLEARN_DATA`` points (it knows no folder beside the
repository). On this project's machines the files live in ``../shared/data``; the tests,
the chapters they execute and the book build they start all see it through the
environment variable set here (``book/conftest.py`` does the same for a chapter run alone
under nbval). A value already set is kept.

The book build (``built_book``) is the exception: it runs as a newcomer's does, on a fresh
copy of the checkout's files (no data folder in it or beside it), with no ``FEDLEARN_*``
variable of this environment and with ``FEDLEARN_OFFLINE=1`` (the package downloads
nothing), so every chapter is built on its bundled fallback; the reader's copies under
nbval (``tests/book/test_reader_copies.py``) keep the data, so CI executes both paths where they
differ: the copies of the chapters that asked the build for a data set it lacked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = int(os.environ.get("FEDLEARN_BOOK_TIMEOUT", "3600"))
# The build reads (so executes) this many pages at once: Sphinx's parallel read, which the
# jupyter-book CLI does not expose. Every chapter's kernel computes on one thread
# (torch.set_num_threads(1) in its imports cell), so two at a time suit a 2-core machine.
BUILD_JOBS = int(os.environ.get("FEDLEARN_BOOK_JOBS", str(min(2, os.cpu_count() or 1))))
SHARED_DATA = REPO.parent / "shared" / "data"
if SHARED_DATA.is_dir():
    os.environ.setdefault("FEDLEARN_DATA", str(SHARED_DATA))


@pytest.fixture
def fed():
    """The small federation of the run tests: six digits clients in two label-shift clusters, 30 samples each."""
    from fedlearn_edu.data import shifted_federation

    return shifted_federation("digits", "label", 2, 3, samples_per_client=30, seed=0)


@pytest.fixture
def mlp():
    """``mlp(federation, seed=0, hidden=(16,))``: a small seeded MLP for a federation's inputs and classes."""
    from fedlearn_edu.models import make_model

    def make(federation, seed: int = 0, hidden=(16,)):
        return make_model("mlp", federation.input_shape, federation.num_classes, hidden=hidden, seed=seed)

    return make


@pytest.fixture(scope="module")
def setting():
    """The bad-client tests' ``(fed, bad, val, model)``: six digits clients (Dirichlet 0.5) less a server
    validation split ``val``, the same federation whose client ``tests.bad_client.BAD`` holds a NaN input
    (``bad``), and a small seeded MLP."""
    from fedlearn_edu import federated_dataset, make_model
    from fedlearn_edu.data import server_validation_split
    from fedlearn_edu.data.federation import ClientData, Federation
    from tests.bad_client import BAD

    fed = federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)
    fed, val = server_validation_split(fed, fraction=0.2, seed=0)
    clients = [ClientData(c.train_x.clone(), c.train_y, c.test_x, c.test_y, c.info) for c in fed]
    clients[BAD].train_x[0, 0, 0, 0] = float("nan")  # after construction: ClientData refuses NaN inputs
    bad = Federation(clients, fed.num_classes, fed.name)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    return fed, bad, val, model


def pytest_collection_modifyitems(config, items):
    """Mark every item that executes a chapter (nbval), needs the built book or builds the package as ``book``,
    and every replay of committed records (``records``) as ``slow``; note each item's tier."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        heavy = {"built_book", "built_dist", "fresh_venv"}
        if item.path.suffix == ".ipynb" or heavy.intersection(fixtures):
            item.add_marker(pytest.mark.book)
        if item.get_closest_marker("records"):
            item.add_marker(pytest.mark.slow)
        _TIER[item.nodeid] = next((t for t in TIERS[:-1] if item.get_closest_marker(t)), "unit")


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


# What a fresh clone holds is what git tracks (plus new files not yet committed, not ignored);
# without git (an unpacked archive), the tree less what .gitignore keeps out of a clone.
NOT_IN_A_CLONE = {  # folder (relative to the checkout) -> names left out there
    ".": {".git", "data", "build", "dist"},
    "book": {"data"},
}
NOT_IN_A_CLONE_ANYWHERE = ("_build", ".venv", "venv", "node_modules", "__pycache__", "*.egg-info", ".ipynb_checkpoints")


def newcomer_env(environ) -> dict:
    """The environment of a newcomer's book build: ``environ`` without any ``FEDLEARN_*`` variable
    (no ``FEDLEARN_DATA``, no ``FEDLEARN_FULL``), with ``FEDLEARN_OFFLINE=1`` (no downloads) and
    ``MPLBACKEND=Agg``, as many servers and CI images export it: the chapters must keep their
    figures (their set-up cell selects the inline backend), or the build fails on undefined figure
    labels."""
    env = {k: v for k, v in environ.items() if not k.startswith("FEDLEARN_")}
    env.update(FEDLEARN_OFFLINE="1", PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    return env


def newcomer_checkout(repo: Path, dest: Path) -> Path:
    """Copy into ``dest`` the files a fresh clone of ``repo`` has; return ``dest``.

    No ``data/`` or ``book/data/`` (where torchvision's downloads land, ignored by git), no
    ``_build``, no virtual environment, and nothing beside it: ``dest``'s parent holds no
    ``shared/data``.
    """
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout.decode()
        files = [f for f in listed.split("\0") if f and (repo / f).is_file()]
    except (OSError, subprocess.SubprocessError):  # no git, or not a git checkout
        files = None
    if files is None:
        anywhere = shutil.ignore_patterns(*NOT_IN_A_CLONE_ANYWHERE)

        def ignore(folder, names):
            here = Path(folder).relative_to(repo).as_posix()
            return set(anywhere(folder, names)) | (NOT_IN_A_CLONE.get(here, set()) & set(names))

        shutil.copytree(repo, dest, ignore=ignore)
        return dest
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f, dest / f)
    return dest


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """Build the book into a temporary folder, as a newcomer's offline build; return its ``_build/html``.

    The build runs on :func:`newcomer_checkout` (a fresh copy of the checkout's files) with
    :func:`newcomer_env`: no data set beyond the bundled ones, no download. For quick
    iterations on the book tests, ``FEDLEARN_BOOK_HTML=_build/html`` reuses an existing build
    instead (CI never sets it).
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
    checkout = newcomer_checkout(REPO, tmp_path_factory.mktemp("fresh_clone") / "fedlearn-edu")
    # `--path-output DIR` writes the HTML to DIR/_build/html.
    cmd = [
        sys.executable,
        "-c",
        # the CLI's own command, with Sphinx's parallel read (the CLI imports build_sphinx when it runs)
        "import functools, sys; import jupyter_book.sphinx as s; "
        f"s.build_sphinx = functools.partial(s.build_sphinx, jobs={BUILD_JOBS}); "
        "from jupyter_book.cli.main import main; sys.exit(main())",
        "build",
        str(checkout),
        "--path-output",
        str(out),
        "-W",
        "-n",
        "--keep-going",
    ]
    try:
        proc = subprocess.run(
            cmd,
            cwd=checkout,
            env=newcomer_env(os.environ),
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


# --------------------------------------------------------------------------- #
# time per tier: CI prints, for each tier of the suite, its total and its 25 slowest tests

TIERS = ("deployment", "book", "slow", "unit")  # a test's tier: its first marker of these, else "unit"
SLOWEST = 25
_TIMES: dict[str, dict[str, float]] = {tier: {} for tier in TIERS}
_TIER: dict[str, str] = {}  # node id -> tier, noted at collection (the markers, not the test's path)


def pytest_runtest_logreport(report):
    """Add each phase's time (set-up, call, tear-down) to its test, under the test's tier."""
    times = _TIMES[_TIER.get(report.nodeid, "unit")]
    times[report.nodeid] = times.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Per tier (``-m "not book and not deployment and not slow"`` is the unit tier): tests, seconds, the slowest."""
    tr = terminalreporter
    if not any(_TIMES.values()):
        return
    tr.section("time per tier (set-up + call + tear-down; a session fixture counts for its first test)")
    for tier in TIERS:
        times = _TIMES[tier]
        if times:
            tr.write_line(f"{tier:>10}: {len(times):5d} tests {sum(times.values()):8.1f} s")
    for tier in TIERS:
        times = _TIMES[tier]
        if not times:
            continue
        tr.write_sep("-", f"the {min(SLOWEST, len(times))} slowest of the {tier} tier")
        for nodeid, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:SLOWEST]:
            tr.write_line(f"{seconds:8.2f} s  {nodeid}")

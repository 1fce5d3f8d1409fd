"""The book build the tests run is a newcomer's: no data set beyond the bundled ones, no download.

``tests/conftest.py``'s ``built_book`` builds :func:`~tests.conftest.newcomer_checkout` (a fresh
copy of the checkout's files) with :func:`~tests.conftest.newcomer_env`. These tests check both
on small fakes, and that under them the package finds no MNIST and downloads nothing, however
the developer's machine is set up (``FEDLEARN_DATA`` exported, MNIST beside the checkout, a
``book/data`` left by an online run). ``tests/book/test_book.py`` checks the built pages.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import newcomer_checkout, newcomer_env
from tests.data.test_datasets import write_tiny_idx_set

REPO = Path(__file__).resolve().parents[1]


def test_newcomer_env_drops_every_fedlearn_variable_and_turns_downloads_off():
    mine = {"PATH": "/usr/bin", "HOME": "/home/me", "FEDLEARN_DATA": "/data", "FEDLEARN_FULL": "1"}
    env = newcomer_env(mine)
    assert "FEDLEARN_DATA" not in env and "FEDLEARN_FULL" not in env
    assert env["FEDLEARN_OFFLINE"] == "1" and env["MPLBACKEND"] == "Agg"
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/me"
    assert mine["FEDLEARN_DATA"] == "/data"  # the caller's environment is left as it was


def test_built_book_builds_a_fresh_copy_in_the_newcomer_env():
    source = inspect.getsource(conftest.built_book)
    assert "newcomer_checkout(REPO" in source and "env=newcomer_env(os.environ)" in source
    assert "cwd=checkout" in source and "str(checkout)" in source
    assert "cwd=REPO" not in source and "str(REPO)" not in source


def _fake_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copy2(REPO / ".gitignore", root / ".gitignore")
    for f in ("book/ch01.ipynb", "fedlearn_edu/data/__init__.py", "fedlearn_edu/data/fallback.py", "README.md"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f"# {f}\n")
    write_tiny_idx_set(root / "book" / "data" / "MNIST" / "raw", gz=False)  # torchvision's download, ignored
    write_tiny_idx_set(root / "data" / "MNIST" / "raw", gz=False)
    (root / "_build" / "html").mkdir(parents=True)
    (root / "_build" / "html" / "index.html").write_text("old build")
    (root / "fedlearn_edu" / "__pycache__").mkdir()
    (root / "fedlearn_edu" / "__pycache__" / "x.pyc").write_bytes(b"")
    return root


@pytest.mark.parametrize("with_git", [True, False], ids=["git checkout", "unpacked archive"])
def test_newcomer_checkout_copies_what_a_clone_has(tmp_path, with_git):
    repo = _fake_repo(tmp_path / "repo")
    if with_git:
        if shutil.which("git") is None:
            pytest.fail("git is needed for this test (apt-get install -y git)")
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    copy = newcomer_checkout(repo, tmp_path / "clone" / "fedlearn-edu")
    files = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    assert files == sorted(
        [".gitignore", "README.md", "book/ch01.ipynb", "fedlearn_edu/data/__init__.py", "fedlearn_edu/data/fallback.py"]
    ), files


def test_the_newcomer_build_finds_no_mnist_and_downloads_nothing(tmp_path):
    """On a copy of this checkout, in the newcomer env made from an environment that *has* MNIST."""
    store = tmp_path / "clone" / "shared" / "data"  # beside the copy, as ../shared/data on the project's machines
    write_tiny_idx_set(store / "mnist", gz=False)
    copy = newcomer_checkout(REPO, tmp_path / "clone" / "fedlearn-edu")
    env = newcomer_env({**os.environ, "FEDLEARN_DATA": str(store)})
    script = (
        "import torchvision.datasets as tvd\n"
        "def refuse(*args, **kwargs):\n"
        "    raise AssertionError('torchvision was asked to download')\n"
        "tvd.MNIST = tvd.FashionMNIST = tvd.CIFAR10 = refuse\n"
        "from fedlearn_edu.data import dataset_or_digits, load_dataset\n"
        "assert dataset_or_digits('mnist') == 'digits'\n"
        "try:\n"
        "    load_dataset('mnist', download=True)\n"
        "except FileNotFoundError as err:\n"
        "    assert 'FEDLEARN_OFFLINE' in str(err), str(err)\n"
        "else:\n"
        "    raise AssertionError('MNIST was found')\n"
        "print('no MNIST, no download')\n"
    )
    # the chapters run in book/ (the kernel's working directory), where torchvision's ./data would be
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=copy / "book", env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Note: mnist is not available here" in proc.stdout
    assert "using scikit-learn's bundled digits instead" in proc.stdout
    assert proc.stdout.strip().endswith("no MNIST, no download")

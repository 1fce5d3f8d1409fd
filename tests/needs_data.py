"""Tests that read a data set the package does not bundle: they skip, saying why, where it is absent.

A newcomer's ``python -m pytest`` on a fresh clone has neither MNIST (found where ``FEDLEARN_DATA``
points; ``tests/conftest.py`` points it at ``../shared/data``, which only this project's machines
have) nor, unless they ran the README's set-up, Debian's Fashion-MNIST. Those tests then skip with
the reason and the fix in the skip message (``pytest -rs`` prints it; ``pyproject.toml``'s
``addopts`` has it).

Where the data must be there, a skip would hide a test that stopped running: ``FEDLEARN_REQUIRE_DATA``
names the data sets that must be present (comma-separated: ``fashion-mnist``, ``mnist``; ``1`` for
all), and a test needing one of them fails instead of skipping. ``.ci/run`` requires Fashion-MNIST
(it installs it) and, when ``../shared/data`` exists, MNIST.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REQUIRE_DATA = "FEDLEARN_REQUIRE_DATA"  # e.g. "fashion-mnist,mnist" (.ci/run): those may not skip
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
MNIST_FILE = FASHION_FILE = "train-labels-idx1-ubyte.gz"  # the file whose presence the tests check


def mnist_dir() -> Path:
    """Where the tests look for MNIST: ``$FEDLEARN_DATA/mnist`` (``tests/conftest.py`` sets the variable)."""
    return Path(os.environ.get("FEDLEARN_DATA", "/nonexistent")) / "mnist"


def required() -> set[str]:
    """The data sets ``FEDLEARN_REQUIRE_DATA`` names (``{"all"}`` for ``1``)."""
    value = os.environ.get(REQUIRE_DATA, "").strip().lower()
    if value in ("1", "all"):
        return {"all"}
    return {name.strip() for name in value.split(",") if name.strip()}


def require(path: Path, name: str, what: str, fix: str) -> None:
    """Skip the calling test, with ``what`` and ``fix`` as the reason, unless ``path`` exists.

    When ``FEDLEARN_REQUIRE_DATA`` names ``name`` (or is ``1``) the test fails instead.
    """
    if path.exists():
        return
    reason = f"{what} is absent ({path} does not exist): {fix}"
    if {name, "all"} & required():
        pytest.fail(f"{reason}. {REQUIRE_DATA} requires {name} here, so this test may not skip.")
    pytest.skip(reason)


def require_mnist() -> Path:
    """The MNIST folder, or a skip (a failure where ``FEDLEARN_REQUIRE_DATA`` names ``mnist``)."""
    folder = mnist_dir()
    require(
        folder / MNIST_FILE,
        "mnist",
        "MNIST",
        "set FEDLEARN_DATA to a folder whose mnist/ holds MNIST's four IDX files (.gz); "
        "this project's machines have one in ../shared/data, which tests/conftest.py uses",
    )
    return folder


def require_fashion_mnist() -> Path:
    """Debian's Fashion-MNIST folder, or a skip (a failure where ``FEDLEARN_REQUIRE_DATA`` names ``fashion-mnist``)."""
    require(
        FASHION_DIR / FASHION_FILE,
        "fashion-mnist",
        "Fashion-MNIST",
        "apt-get install dataset-fashion-mnist (the README's set-up command and .ci/run do)",
    )
    return FASHION_DIR

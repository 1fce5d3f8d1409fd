"""A chapter alone, outside the repository, in a fresh virtual environment (no fedlearn_edu).

1. Where the install cannot succeed (no package index, git refused): the first cell fails with the
   install cell's message, not with ``ModuleNotFoundError`` one cell later.
2. Where it can: the chapter's **reader's copy** (what Colab and Binder open, from the book build;
   its code cells are the chapter's) runs top to bottom through its install cell, as a reader in
   Colab would run it. The cell installs ``fedlearn-edu @ git+<repository>@<commit or branch>``, which
   is out of reach offline: the test checks that source line and points it at the locally built
   wheel instead (the rest of the cell runs as it is).

The venv gets ipykernel and nbclient; for the second case also torch/torchvision, the wheel's
other dependencies (read from its metadata) and ipywidgets, as a reader's environment (Colab's)
would have them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHAPTER = REPO / "book" / "ch06_fedoui.ipynb"  # small, on the bundled digits
TORCH = ["torch==2.14.1", "torchvision==0.29.1"]

RUN = """\
import json, sys
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
    print(json.dumps({"ok": True}))
except CellExecutionError as err:
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    failed = next(i for i in code if any(o.get("output_type") == "error" for o in nb.cells[i].get("outputs", [])))
    print(json.dumps({"ok": False, "code_cell": code.index(failed), "error": str(err)[-3000:]}))
"""


def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "JUPYTER", "VIRTUAL_ENV"))}
    env.update(HOME=str(tmp / "home"), JUPYTER_PATH="", MPLBACKEND="Agg", **extra)
    return env


def _pip(py: Path, *args: str) -> None:
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]


PINNED_SOURCE = re.compile(r'SOURCE = "fedlearn-edu @ git\+https://github\.com/[\w.-]+/[\w.-]+@([\w./-]+)"')


def _from_wheel(text: str, wheel: Path) -> str:
    """The notebook ``text`` whose install cell installs ``wheel`` in place of its pinned git source."""
    nb = json.loads(text)
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    source = "".join(first["source"])
    assert len(PINNED_SOURCE.findall(source)) == 1, source  # the cell installs the repository at one ref
    source = PINNED_SOURCE.sub(f'SOURCE = "fedlearn-edu @ {wheel.as_uri()}"', source)
    first["source"] = source.splitlines(keepends=True)
    return json.dumps(nb)


def _run_chapter(py: Path, work: Path, env: dict, chapter: Path = CHAPTER, wheel: Path | None = None) -> dict:
    nb = work / chapter.name
    text = chapter.read_text(encoding="utf-8")
    nb.write_text(_from_wheel(text, wheel) if wheel else text, encoding="utf-8")
    proc = subprocess.run(
        [str(py), "-c", RUN, str(nb), str(work)], cwd=work, env=env, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("standalone")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    _pip(py, "ipykernel", "nbclient", "nbformat")
    (root / "home").mkdir()
    return py, root


def test_chapter_alone_where_install_cannot_succeed(fresh_venv):
    py, root = fresh_venv
    work = root / "cannot"
    work.mkdir()
    (root / "empty").mkdir(exist_ok=True)
    env = _env(root, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(root / "empty"), GIT_ALLOW_PROTOCOL="file")
    result = _run_chapter(py, work, env)
    assert not result["ok"]
    assert result["code_cell"] == 0, result
    assert "Could not install fedlearn_edu from GitHub" in result["error"]
    assert "pip install 'fedlearn-edu @ git+https://github.com/" in result["error"]
    assert "ModuleNotFoundError" not in result["error"]


@pytest.fixture(scope="module")
def reader_venv(fresh_venv, built_dist) -> tuple[Path, Path, Path]:
    """The fresh venv with what a reader's environment has (torch, the wheel's dependencies), not fedlearn_edu."""
    py, root = fresh_venv
    wheel = built_dist["wheel"]
    with zipfile.ZipFile(wheel) as zf:
        meta = Parser().parsestr(zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode())
    deps = [
        d for d in meta.get_all("Requires-Dist") if "extra ==" not in d and not d.startswith(("torch", "torchvision"))
    ]
    _pip(py, *TORCH, *deps, "ipywidgets")  # the chapters' sliders: Colab ships ipywidgets, Binder installs it
    return py, root, wheel


def _installed_from_the_wheel(py: Path, root: Path, work: Path) -> None:
    """The chapter used the package its install cell put in the venv (not this checkout: no PYTHONPATH)."""
    where = subprocess.run(
        [str(py), "-c", "import fedlearn_edu; print(fedlearn_edu.__file__)"],
        cwd=work,
        env=_env(root),
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(root / "venv")) and "site-packages" in where.stdout, where


def _uninstall(py: Path) -> None:
    proc = subprocess.run(
        [str(py), "-m", "pip", "uninstall", "-y", "-q", "fedlearn-edu"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_reader_copy_alone_runs_from_the_built_wheel(reader_venv, built_book):
    """The reader's copy, not the chapter: its code cells are the chapter's own
    (``test_reader_copy_has_no_raw_myst_and_no_visible_solution``), so one run proves both."""
    py, root, wheel = reader_venv
    chapter = built_book / "readers" / "book" / CHAPTER.name
    assert chapter.is_file(), chapter
    work = root / "reader"
    work.mkdir()
    env = _env(root, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheel.parent), GIT_ALLOW_PROTOCOL="file")
    try:
        result = _run_chapter(py, work, env, chapter, wheel)
        assert result["ok"], result
        _installed_from_the_wheel(py, root, work)
    finally:
        _uninstall(py)

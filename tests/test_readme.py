"""Every ```python block of README.md runs verbatim, in a fresh process, and stays quiet.

A reader copies a block into a file and runs it: so does this test, in an empty temporary
folder (the benchmark block writes ``runs/`` there), with the checkout on ``PYTHONPATH``.
The blocks that train for more than ~20 s run with the book's tests (``-m book``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```$", (REPO / "README.md").read_text(encoding="utf-8"), re.M | re.S)

# blocks that train for more than ~20 s on a 2-core CPU: the benchmark, a 30-round run, the Flower federation
SLOW = ("benchmark.run(", "simulate(", "LocalGrid(")
MAX_OUTPUT = 10_000  # characters: what the block prints, not pages of library logs


def _params():
    for i, code in enumerate(BLOCKS):
        first = next(line for line in code.splitlines() if line and not line.startswith(("import", "from", "#")))
        marks = [pytest.mark.book] if any(s in code for s in SLOW) else []
        yield pytest.param(code, id=f"{i}: {first[:40]}", marks=marks)


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) == 4
    assert any("LocalGrid(" in code for code in BLOCKS) and any("check_fedavg(" in code for code in BLOCKS)


@pytest.mark.parametrize("code", list(_params()))
def test_a_readme_block_runs_verbatim_and_quietly(tmp_path, code):
    (tmp_path / "block.py").write_text(code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    run = subprocess.run(
        [sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert run.stdout.strip(), "the block prints nothing: a reader cannot tell that it worked"
    assert len(output) < MAX_OUTPUT, f"{len(output)} characters of output:\n{output[:2000]}"


README = (REPO / "README.md").read_text(encoding="utf-8")


def _first_five_minutes() -> str:
    assert "## First five minutes" in README, "README's shortest path for a reader is gone"
    section = README.split("## First five minutes", 1)[1].split("\n## ", 1)[0]
    assert README.index("## First five minutes") < README.index("## Quick start")
    return section


def test_first_five_minutes_installs_cpu_torch_then_the_package_from_the_repository():
    from fedlearn_edu.cli import build_parser

    sys.path.insert(0, str(REPO / "book" / "_ext"))
    from reader_copies import book_config, launch_urls

    section = _first_five_minutes()
    assert launch_urls(book_config(REPO)["repository_url"], "book/ch01_fedavg")["Colab"] in section
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = block.strip().splitlines()
    torch = next(i for i, line in enumerate(lines) if " install torch " in line)
    assert lines[torch].endswith("--index-url https://download.pytorch.org/whl/cpu")  # not the CUDA build
    package = next(i for i, line in enumerate(lines) if "fedlearn-edu @ git+" in line)
    assert torch < package and book_config(REPO)["repository_url"] in lines[package]
    command = lines[-1].split()
    assert command[1:3] == ["-m", "fedlearn_edu"]
    args = build_parser().parse_args(command[3:])  # the flags the command line takes
    assert args.command == "run" and args.rounds <= 10 and args.dataset == "digits"  # bundled: no download
    assert re.search(r"\b\d+ s measured\b", section)


def test_readme_never_installs_the_package_from_the_index():
    """The name fedlearn-edu is not registered on the package index: whoever took it would run their code."""
    bare = re.findall(r"pip install\s+[\"']?fedlearn[-_]edu(?:\[[\w,]+\])?[\"']?(?!\s*@)", README)
    assert not bare, bare

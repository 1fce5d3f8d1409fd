"""The package's docstrings follow the Google convention it claims, and every public function documents its arguments.

ruff's pydocstyle rules (``D``, Google convention, configured in pyproject.toml) check the form;
the AST walk below checks what ruff does not: that a public function or method with parameters
has an ``Args:`` section at all. Files pyproject.toml exempts from ``D`` are exempt here too.
"""

from __future__ import annotations

import ast
import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fedlearn_edu"


def _ruff_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]


def _exempt(path: Path) -> bool:
    rel = path.relative_to(REPO).as_posix()
    ignores = _ruff_config().get("per-file-ignores", {})
    return any("D" in codes and fnmatch.fnmatch(rel, pattern) for pattern, codes in ignores.items())


def _ruff() -> str:
    here = Path(sys.executable).parent / "ruff"
    found = str(here) if here.exists() else shutil.which("ruff")
    assert found, "ruff is not installed: pip install -e '.[dev]' (pyproject.toml pins it)."
    return found


def test_the_google_convention_is_configured_for_the_package():
    lint = _ruff_config()
    assert "D" in lint["select"]
    assert lint["pydocstyle"]["convention"] == "google"
    checked = [p for p in PACKAGE.rglob("*.py") if not _exempt(p)]
    assert len(checked) > 40, "pyproject.toml exempts most of the package from the docstring rules"


def test_ruff_with_pydocstyle_passes_on_the_package():
    proc = subprocess.run(
        [_ruff(), "check", "--output-format", "concise", str(PACKAGE)],  # pyproject.toml's rules, D among them
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _public_functions(tree: ast.Module):
    """``(qualified name, node)`` of the public module-level functions and public classes' methods."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_"):
                    yield f"{node.name}.{sub.name}", sub


def _parameters(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
    return names + [f"*{a.arg}" for a in (args.vararg, args.kwarg) if a is not None]


def test_every_public_function_with_parameters_has_an_args_section():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _exempt(path):
            continue
        for name, fn in _public_functions(ast.parse(path.read_text(encoding="utf-8"))):
            properties = any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
            if properties or not _parameters(fn):
                continue
            if "Args:" not in (ast.get_docstring(fn) or ""):
                missing.append(f"{path.relative_to(REPO)}:{fn.lineno} {name}")
    assert not missing, "public functions without an Args: section:\n" + "\n".join(missing)

"""No chapter asserts or glues a value that depends on wall-clock time.

How long a cell takes depends on the machine and on what else runs on it, so a claim
about it is true on one build and false on the next: asserted, it makes the build flaky;
glued, it prints one machine's figure as the book's. Timings belong in ``benchmarks/``
(run by hand) or in a printed line, never in an ``assert`` or a ``glue(...)``.

The scan is static (``ast``, no execution): a value is *timed* when it comes from a clock of
the ``time`` module (``time.perf_counter()``, ``time.time()``, ``time.monotonic()`` ...), from a
``seconds`` attribute or item (``History.seconds``, ``diagnostics[r]["seconds"]``), or from a
name, container or function that a timed value flows into, across the cells of the notebook.
A chapter fails when an ``assert`` statement or a ``glue(...)`` call reads a timed value.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[2] / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))  # every notebook page: the chapters and the closing page

CLOCKS = {
    "perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
    "process_time", "process_time_ns", "thread_time", "thread_time_ns",
}  # fmt: skip
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault"}

# Chapters that still glue or assert a timing, with the reason; each entry must still be true
# (the test fails when the chapter no longer does it, so the entry is removed with the fix).
KNOWN: dict[str, str] = {}


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _parse(source: str) -> ast.Module:
    """A code cell as Python: IPython magics and shell escapes (``%...``, ``!...``) removed."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    return ast.parse("\n".join(lines))


def _root(node: ast.AST) -> str | None:
    """The name at the root of a target: ``x`` of ``x``, ``x[k]``, ``x.a[k]``."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _names(target: ast.AST) -> set[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_names(t) for t in target.elts)) if target.elts else set()
    root = _root(target)
    return {root} if root else set()


class _Scan:
    def __init__(self, modules: list[ast.Module]):
        self.modules = modules
        self.clock_names: set[str] = set()  # `from time import perf_counter [as pc]`
        self.time_modules: set[str] = set()  # `import time [as t]`
        self.timed: set[str] = set()  # names (variables, containers, functions) holding a timed value
        for module in modules:
            for node in ast.walk(module):
                if isinstance(node, ast.Import):
                    self.time_modules |= {a.asname or a.name for a in node.names if a.name == "time"}
                elif isinstance(node, ast.ImportFrom) and node.module == "time":
                    self.clock_names |= {a.asname or a.name for a in node.names if a.name in CLOCKS}
        self._propagate()

    def is_timed(self, expr: ast.AST | None) -> bool:
        if expr is None:
            return False
        for node in ast.walk(expr):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and f.attr in CLOCKS and _root(f.value) in self.time_modules:
                    return True
                if isinstance(f, ast.Name) and (f.id in self.clock_names or f.id in self.timed):
                    return True
            elif isinstance(node, ast.Attribute) and node.attr == "seconds":
                return True
            elif isinstance(node, ast.Subscript):
                key = node.slice
                if isinstance(key, ast.Constant) and key.value == "seconds":
                    return True
            elif isinstance(node, ast.Name) and node.id in self.timed:
                return True
        return False

    def _propagate(self) -> None:
        changed = True
        while changed:
            before = len(self.timed)
            for module in self.modules:
                for node in ast.walk(module):
                    if isinstance(node, ast.Assign) and self.is_timed(node.value):
                        for target in node.targets:
                            self.timed |= _names(target)
                    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and self.is_timed(node.value):
                        self.timed |= _names(node.target)
                    elif isinstance(node, ast.NamedExpr) and self.is_timed(node.value):
                        self.timed |= _names(node.target)
                    elif isinstance(node, (ast.For, ast.comprehension)) and self.is_timed(node.iter):
                        self.timed |= _names(node.target)
                    elif (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and node.func.attr in MUTATORS
                        and any(self.is_timed(a) for a in [*node.args, *(k.value for k in node.keywords)])
                    ):
                        root = _root(node.func.value)
                        if root:
                            self.timed.add(root)
                    elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
                        returns = (
                            [node.body]
                            if isinstance(node, ast.Lambda)
                            else [r.value for r in ast.walk(node) if isinstance(r, ast.Return)]
                        )
                        if isinstance(node, ast.FunctionDef) and any(self.is_timed(r) for r in returns):
                            self.timed.add(node.name)
            changed = len(self.timed) != before

    def violations(self) -> list[str]:
        found = []
        for cell, module in enumerate(self.modules):
            for node in ast.walk(module):
                if isinstance(node, ast.Assert) and self.is_timed(node.test):
                    found.append(f"code cell {cell}, line {node.lineno}: assert {ast.unparse(node.test)}")
                elif isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    args = [*node.args, *(k.value for k in node.keywords)]
                    if name == "glue" and any(self.is_timed(a) for a in args):
                        found.append(f"code cell {cell}, line {node.lineno}: {ast.unparse(node)}")
        return found


def timing_claims(cells: list[str]) -> list[str]:
    """The asserts and glue calls of a notebook's code cells that read a wall-clock value."""
    return _Scan([_parse(c) for c in cells]).violations()


def test_the_scanner_finds_timed_asserts_and_glues_and_ignores_printed_times():
    cells = [
        "%matplotlib inline\nimport time\nfrom time import perf_counter as pc\nSTART = time.perf_counter()",
        "t0 = pc()\nrun()\nseconds = pc() - t0\nprint(f'{seconds:.1f} s')",  # printed: fine
        "assert seconds < 2.0",  # a timed assert (cell 2)
        "def best(f):\n    ts = []\n    for _ in range(3):\n        s = time.perf_counter()\n        f()\n"
        "        ts.append(time.perf_counter() - s)\n    return min(ts), f()\n"
        "a, out = best(g)\nglue('speedup', a / 2)",  # a timed glue through a function (cell 3)
        "glue('acc', history.client_accuracy[-1])\nglue('t', history.seconds)",  # History.seconds (cell 4)
        "rate = {k: d['seconds'] for k, d in runs.items()}\nassert all(v > 0 for v in rate.values())",
        "acc = 0.9\nassert acc > 0.5\nglue('acc', acc)\nprint(time.perf_counter() - START)",  # fine
    ]
    found = timing_claims(cells)
    assert [f.split(",")[0] for f in found] == ["code cell 2", "code cell 3", "code cell 4", "code cell 5"]
    assert "glue('t', history.seconds)" in found[2] and "acc" not in found[2]
    assert timing_claims(cells[:2] + cells[6:]) == []


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_asserts_or_glues_a_timing(path: Path):
    found = timing_claims(_code_cells(path))
    if path.stem in KNOWN:
        assert found, f"{path.name} no longer asserts or glues a timing: remove it from KNOWN ({KNOWN[path.stem]})"
        return
    assert not found, (
        f"{path.name} asserts or glues a value measured by the clock, true on one machine and false on "
        f"another; print it, or move the measurement to benchmarks/ (run by hand): {found}"
    )

"""A problem set from a chapter: the instructor's source and the students' release (nbgrader formats).

:func:`source_notebook` keeps every cell of the chapter and marks each solution for nbgrader:
its code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (for a function an exercise's
checker tests, only the function's body, so the signature stays), its prose likewise. Each
checker call of a solution moves to a **graded cell** of its own (locked, with points), with the
checker and the function it tests in the cell's ``fedlearn_edu`` metadata, which
:mod:`fedlearn_edu.coursework.grading` reads.

:func:`release_notebook` is what nbgrader's ``generate_assignment`` makes of the source: every
solution region replaced by ``# YOUR CODE HERE`` / ``raise NotImplementedError()`` (prose by
``YOUR ANSWER HERE``), no output. It runs top to bottom: a stubbed function only raises when
called, and its checker catches that and prints the failing case; a cell that is a solution as
a whole raises, and carries the ``raises-exception`` tag so that a top-to-bottom run goes on.
The text outside the solutions that quotes a number glued in a solution cell (the answer) says
"your result" instead.

Points: an exercise's stars (★ routine, ★★, ★★★) are each of its graded cells' points. Written
answers are nbgrader's manually graded cells with 0 points (``grade`` scores the checkers only;
give them points in nbgrader's formgrader to grade them by hand).
"""

from __future__ import annotations

import ast
import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .notebook import cell_source, split_solutions

__all__ = ["GradedItem", "assign", "graded_items", "release_notebook", "source_notebook"]

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
TEXT_STUB = "YOUR ANSWER HERE"
GIVEN_AWAY = "*(your result)*"
EXERCISE = re.compile(
    r"^[ \t]*(`{3,}|:{3,})[ \t]*\{exercise\}(?P<title>.*)\n(?:.*\n)*?[ \t]*:label:[ \t]*(?P<label>\S+)", re.M
)
GLUE_CALL = re.compile(r"""\bglue\(\s*f?["'](?P<key>[^"'{]+)["']""")
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`(?P<key>[^`:]+)(?::[^`]*)?`")


@dataclass(frozen=True)
class GradedItem:
    """One checker call of an exercise: what ``grade`` scores.

    Attributes:
        grade_id: nbgrader's id of the graded cell (the exercise's label, plus the function when
            an exercise has several).
        exercise: the exercise's label (``"ex-ch1-weights"``).
        checker: the checker's name in :mod:`fedlearn_edu.exercises` (``"check_fedavg"``).
        function: the name of the student's function it checks (``"my_fedavg"``).
        points: the most the item scores.
    """

    grade_id: str
    exercise: str
    checker: str
    function: str
    points: float


def _meta(solution: bool, grade: bool, grade_id: str, points: float | None = None, locked: bool = False) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if grade:
        meta["points"] = points
    meta["task"] = False
    return meta


def _cell(kind: str, text: str, nbgrader: dict | None = None, tags=(), extra: dict | None = None) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    if nbgrader:
        cell["metadata"]["nbgrader"] = nbgrader
    if tags:
        cell["metadata"]["tags"] = list(tags)
    if extra:
        cell["metadata"]["fedlearn_edu"] = extra
    return cell


def _region(lines: list[str], indent: str = "") -> list[str]:
    return [indent + BEGIN, *lines, indent + END]


def _checker_call(stmt: ast.stmt, checkers) -> tuple[str, str] | None:
    """``(checker, function)`` when ``stmt`` is ``[assert] check_x(name, ...)``."""
    node = stmt.test if isinstance(stmt, ast.Assert) else stmt.value if isinstance(stmt, ast.Expr) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in checkers
        and node.args
        and isinstance(node.args[0], ast.Name)
    ):
        return node.func.id, node.args[0].id
    return None


def _split_graded(code: str, checkers) -> tuple[list[str], list[tuple[str, str]], list[str]] | None:
    """A solution cell that calls checkers, as (answer lines with regions, checker calls, rest lines).

    The answer keeps the imports and each function's signature and docstring, its body a solution
    region; statements after the first checker call are the rest (a solution as a whole).
    ``None`` when the cell calls no checker.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    calls = [(stmt, _checker_call(stmt, checkers)) for stmt in tree.body]
    if not any(call for _, call in calls):
        return None
    lines = code.split("\n")
    answer: list[str] = []
    rest: list[str] = []
    checks: list[tuple[str, str]] = []
    seen_check, prev_end = False, 0
    for stmt, call in calls:
        text = lines[prev_end : stmt.end_lineno]  # the statement with the comments before it
        head = stmt.lineno - 1 - prev_end  # lines of comments and blanks before it
        prev_end = stmt.end_lineno
        if call:
            checks.append(call)
            seen_check = True
        elif seen_check:
            rest.extend(text)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            answer.extend(text)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = stmt.body
            if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring stays
            first = body[0].lineno - 1 - (stmt.end_lineno - len(text)) if body else len(text)
            indent = re.match(r"[ \t]*", lines[body[0].lineno - 1]).group() if body else "    "
            answer.extend(text[:first] + _region(text[first:], indent))
        else:
            answer.extend(text[:head] + _region(text[head:]))
    while rest and not rest[0].strip():
        rest.pop(0)
    return answer, checks, rest


def _exercise_points(markdown: str) -> dict[str, int]:
    """The points of each exercise in a cell, by label: the stars in its title, at least 1."""
    return {m.group("label"): max(1, m.group("title").count("★")) for m in EXERCISE.finditer(markdown)}


def source_notebook(chapter: dict) -> dict:
    """The instructor's version of a chapter (nbgrader's source format); ``chapter`` is left as it is.

    Args:
        chapter: the chapter notebook, as ``json.load`` reads it.

    Returns:
        A new notebook (without outputs): the chapter's cells, split where a solution starts and
        ends; each solution's code and prose between ``### BEGIN SOLUTION`` / ``### END SOLUTION``
        with nbgrader metadata; each checker call in a locked graded cell of its own.

    Raises:
        ValueError: the chapter has no exercise with a solution.
    """
    from ..exercises import CHECKERS

    points: dict[str, int] = {}
    out = copy.deepcopy(chapter)
    cells: list[dict] = []
    inside: str | None = None
    counter: dict[str, int] = {}
    graded_per_exercise: dict[str, list[dict]] = {}
    solutions = 0

    def next_id(label: str, kind: str) -> str:
        counter[label, kind] = counter.get((label, kind), 0) + 1
        return f"{label}-{kind}-{counter[label, kind]}"

    for cell in out["cells"]:
        text = cell_source(cell)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            if inside is None:
                cells.append(cell)
                continue
            solutions += 1
            split = _split_graded(text, CHECKERS)
            if split is None:
                cell["source"] = "\n".join(_region(text.split("\n"))).splitlines(keepends=True)
                cell["metadata"]["nbgrader"] = _meta(True, False, next_id(inside, "code"))
                cells.append(cell)
                continue
            answer, checks, rest = split
            answer_cell = copy.deepcopy(cell)
            answer_cell["source"] = "\n".join(answer).strip("\n").splitlines(keepends=True)
            answer_cell["metadata"]["nbgrader"] = _meta(True, False, next_id(inside, "answer"))
            cells.append(answer_cell)
            for checker, function in checks:
                grade_cell = _cell(
                    "code",
                    f"# Graded ({{points}} point(s)): grading adds hidden cases. Leave this cell as it is.\n"
                    f"from fedlearn_edu.exercises import {checker}\n\n{checker}({function})",
                    _meta(False, True, inside, 0, locked=True),
                    extra={"exercise": inside, "checker": checker, "function": function},
                )
                graded_per_exercise.setdefault(inside, []).append(grade_cell)
                cells.append(grade_cell)
            if rest:
                rest_cell = _cell("code", "\n".join(_region(rest)), _meta(True, False, next_id(inside, "code")))
                cells.append(rest_cell)
            continue
        if cell["cell_type"] != "markdown":
            cells.append(cell)
            continue
        points.update(_exercise_points(text))
        pieces, inside = split_solutions(text, inside)
        for piece, label in pieces:
            if not piece.strip():
                continue
            if label is None:
                md = copy.deepcopy(cell)
                md["source"] = piece.strip("\n").splitlines(keepends=True)
            else:
                solutions += 1
                # nbgrader: a written answer is a manually graded cell; 0 points, which ``grade`` does not score
                meta = _meta(True, True, next_id(label, "text"), points=0)
                md = _cell("markdown", "\n".join(_region([piece.strip("\n")])), meta)
            cells.append(md)
    if not solutions:
        raise ValueError("the notebook has no exercise with a solution ({solution-start} ... {solution-end})")
    for label, grade_cells in graded_per_exercise.items():
        for grade_cell in grade_cells:
            meta, ours = grade_cell["metadata"]["nbgrader"], grade_cell["metadata"]["fedlearn_edu"]
            if len(grade_cells) > 1:
                meta["grade_id"] = f"{label}-{ours['function']}"
            meta["points"] = ours["points"] = points.get(label, 1)
            text = cell_source(grade_cell).replace("{points} point(s)", f"{meta['points']} point(s)")
            grade_cell["source"] = text.splitlines(keepends=True)
    out["cells"] = _unique_ids(cells)
    out.setdefault("metadata", {})["fedlearn_edu"] = {"coursework": "source"}
    return out


def _unique_ids(cells: list[dict]) -> list[dict]:
    """Give every cell an id of its own (nbformat 4.5): a split cell's parts get the original's plus a suffix."""
    seen: set[str] = set()
    for k, cell in enumerate(cells):
        base = cell.get("id") or cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"cell-{k}"
        base = re.sub(r"[^A-Za-z0-9_-]", "-", base)[:60]
        new, n = base, 1
        while new in seen:
            n += 1
            new = f"{base}-{n}"
        cell["id"] = new
        seen.add(new)
    return cells


def _stub(lines: list[str], markdown: bool) -> list[str]:
    """Each solution region of ``lines`` replaced by the stub, at the region's indentation."""
    out, depth, indent = [], 0, ""
    for line in lines:
        if line.strip() == BEGIN:
            depth, indent = depth + 1, line[: len(line) - len(line.lstrip())]
            if depth == 1:
                out.extend([TEXT_STUB] if markdown else [indent + s for s in CODE_STUB])
        elif line.strip() == END:
            depth -= 1
        elif depth == 0:
            out.append(line)
    return out


def release_notebook(source: dict) -> dict:
    """The students' version of a source notebook (:func:`source_notebook`); ``source`` is left as it is.

    Args:
        source: the instructor's version.

    Returns:
        A new notebook: every solution region replaced by a stub, graded cells locked, the prose
        that quotes a solution's glued number made generic, no outputs.
    """
    out = copy.deepcopy(source)
    given_away = set()
    for cell in out["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
            given_away.update(GLUE_CALL.findall(cell_source(cell)))
    for cell in out["cells"]:
        meta = cell.setdefault("metadata", {})
        text = cell_source(cell)
        if meta.get("nbgrader", {}).get("solution"):
            lines = _stub(text.split("\n"), cell["cell_type"] == "markdown")
            text = "\n".join(lines)
            if cell["cell_type"] == "code" and any(line == CODE_STUB[1] for line in lines):
                meta["tags"] = [*meta.get("tags", []), "raises-exception"]  # a solution as a whole: runs on
        elif cell["cell_type"] == "markdown" and given_away:
            text = GLUE_ROLE.sub(lambda m: GIVEN_AWAY if m.group("key") in given_away else m.group(0), text)
        cell["source"] = text.splitlines(keepends=True)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    out.setdefault("metadata", {})["fedlearn_edu"] = {"coursework": "release"}
    return out


def graded_items(notebook: dict) -> list[GradedItem]:
    """The graded cells of a source or release notebook, in order.

    Args:
        notebook: the notebook, as ``json.load`` reads it.

    Returns:
        One :class:`GradedItem` per graded cell (a cell with nbgrader's ``grade`` and this
        package's ``fedlearn_edu`` metadata).
    """
    items = []
    for cell in notebook.get("cells", []):
        ours = cell.get("metadata", {}).get("fedlearn_edu")
        grader = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(ours, dict) and grader.get("grade") and {"checker", "function"} <= set(ours):
            items.append(
                GradedItem(
                    grader["grade_id"], ours["exercise"], ours["checker"], ours["function"], float(grader["points"])
                )
            )
    return items


def _write(nb: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def assign(chapters, out) -> list[tuple[Path, Path]]:
    """Write the source and the release of each chapter: ``out/source/<name>.ipynb``, ``out/release/<name>.ipynb``.

    Args:
        chapters: paths of chapter notebooks.
        out: the assignment's folder (created).

    Returns:
        ``(source path, release path)`` per chapter.

    Raises:
        FileNotFoundError: a chapter does not exist.
        ValueError: a chapter is not a notebook, or has no exercise with a solution.
    """
    written = []
    for chapter in map(Path, chapters):
        if not chapter.is_file():
            raise FileNotFoundError(f"{chapter}: no such notebook")
        try:
            nb = json.loads(chapter.read_text(encoding="utf-8"))
            nb["cells"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{chapter} is not a Jupyter notebook ({err})") from None
        try:
            source = source_notebook(nb)
        except ValueError as err:
            raise ValueError(f"{chapter}: {err}") from None
        paths = Path(out) / "source" / chapter.name, Path(out) / "release" / chapter.name
        _write(source, paths[0])
        _write(release_notebook(source), paths[1])
        written.append(paths)
    return written

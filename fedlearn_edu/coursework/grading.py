"""Grade a class: every submitted notebook run in its own kernel, every graded function scored per case.

``SUBMITTED/<student>/<notebook>.ipynb`` (nbgrader's ``submitted`` layout; ``SUBMITTED`` may also
be the folder above ``submitted/``). Each notebook runs in a worker process of its own
(``python -m fedlearn_edu.coursework.grading --worker ...``) that starts its own kernel (nbclient),
executes the cells (errors allowed, as nbgrader's autograde does), then scores the graded functions
in that kernel (:mod:`fedlearn_edu.coursework.scoring`). The notebook's time limit covers both; a
worker past it is killed. One bad submission never stops the others.

The result: a long CSV (``student, notebook, exercise, points, max_points, status, message``) and
a Markdown summary beside it (``grades.md``: class mean per exercise, the mistakes the checkers
named most often, each student's total).
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from .assignment import graded_items
from .scoring import MARK

__all__ = ["STATUSES", "find_submissions", "grade", "grade_notebook"]

STATUSES = ("ok", "failed", "not_implemented", "timeout", "error", "flagged")
COLUMNS = ("student", "notebook", "exercise", "points", "max_points", "status", "message")
_ROOT = Path(__file__).resolve().parents[2]
# a source checkout's root goes on the kernels' PYTHONPATH, so that they import the package that grades
PACKAGE_ROOT = str(_ROOT) if (_ROOT / "pyproject.toml").is_file() else ""


def find_submissions(submitted) -> list[tuple[str, Path]]:
    """``(student, notebook path)`` for every ``<student>/<name>.ipynb`` under ``submitted``.

    Notebooks one folder deeper count too: nbgrader's ``submitted/<student>/<assignment>/<name>.ipynb``.

    Args:
        submitted: ``submitted/`` or the folder above it.

    Returns:
        The pairs, by student, then path.

    Raises:
        FileNotFoundError: ``submitted`` is not a folder, or holds no student's notebook.
    """
    root = Path(submitted)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder (expected submitted/<student>/<notebook>.ipynb)")
    if (root / "submitted").is_dir():
        root = root / "submitted"
    found = [
        (student.name, path)
        for student in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        for path in sorted([*student.glob("*.ipynb"), *student.glob("*/*.ipynb")])  # nbgrader: <student>/<ps>/
        if not path.parent.name.startswith(".")
    ]
    if not found:
        raise FileNotFoundError(f"{root}: no <student>/<notebook>.ipynb inside")
    return found


def _read(path: Path) -> dict | None:
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        return nb if isinstance(nb, dict) and isinstance(nb.get("cells"), list) else None
    except (OSError, ValueError):
        return None


def _scoring_cell(items, seeds) -> dict:
    payload = [
        {"grade_id": i.grade_id, "checker": i.checker, "function": i.function, "points": i.points} for i in items
    ]
    code = (
        "from fedlearn_edu.coursework.scoring import score as _fedlearn_score\n"
        f"_fedlearn_score(__import__('json').loads({json.dumps(payload)!r}), globals(), {list(seeds)!r})\n"
    )
    return {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}


def _worker(path: str, items_json: str, seeds_json: str, timeout: float) -> int:
    """Run one notebook and its scoring cell in a fresh kernel; print the result lines."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from .assignment import GradedItem

    items = [GradedItem(**i) for i in json.loads(items_json)]
    nb = nbformat.reads(Path(path).read_text(encoding="utf-8"), as_version=4)
    nb.cells.append(nbformat.from_dict(_scoring_cell(items, json.loads(seeds_json))))
    client = NotebookClient(
        nb,
        timeout=timeout,
        allow_errors=True,
        kernel_name="python3",
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(Path(path).parent)}},
    )
    deadline = time.monotonic() + timeout
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                client.timeout = max(1, int(deadline - time.monotonic()))
                client.execute_cell(cell, index)
    except CellTimeoutError:
        print(MARK + json.dumps({"error": "timeout"}), flush=True)
        return 0
    except DeadKernelError as err:
        print(MARK + json.dumps({"error": f"the kernel died ({err})"}), flush=True)
        return 0
    for line in nb.cells[-1].get("outputs", []):
        for text in (line.get("text") or "").splitlines():
            if text.startswith(MARK):
                print(text, flush=True)
    return 0


def grade_notebook(path, items, seeds, timeout: float) -> list[dict]:
    """Run and score one submitted notebook in a worker process of its own.

    Args:
        path: the submitted notebook.
        items: its graded items (:func:`~fedlearn_edu.coursework.assignment.graded_items` of the release).
        seeds: the public seed, then the hidden one.
        timeout: seconds for the whole notebook, its cells and the scoring.

    Returns:
        One row per item: ``{"exercise", "points", "max_points", "status", "message", "mistakes"}``.
    """

    def rows(status, message):
        return [
            {
                "exercise": i.grade_id,
                "points": 0.0,
                "max_points": i.points,
                "status": status,
                "message": message,
                "mistakes": [],
            }
            for i in items
        ]

    if _read(path) is None:
        return rows("error", "not a Jupyter notebook (it does not read as one)")
    _require_kernels()
    payload = json.dumps([i.__dict__ for i in items])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
    env.setdefault("MPLBACKEND", "Agg")
    command = [
        sys.executable,
        "-m",
        "fedlearn_edu.coursework.grading",
        "--worker",
        str(path),
        payload,
        json.dumps(seeds),
        str(timeout),
    ]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout + 60)  # the worker stops itself at `timeout`; this is the backstop
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return rows("timeout", f"did not finish within {timeout:g} s")
    found = {}
    for line in out.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK) :])
            if "error" in result:
                if result["error"] == "timeout":
                    return rows("timeout", f"did not finish within {timeout:g} s (the notebook's cells and the checks)")
                return rows("error", result["error"])
            found[result["grade_id"]] = result
    if proc.returncode != 0 and not found:
        last = (err.strip().splitlines() or ["no message"])[-1]
        return rows("error", f"the grading process failed: {last}")
    out_rows = []
    for item, row in zip(items, rows("error", "no result: the kernel stopped before the checks ran")):
        result = found.get(item.grade_id)
        if result:
            row.update(
                points=result["points"], status=result["status"], message=result["message"], mistakes=result["mistakes"]
            )
        out_rows.append(row)
    return out_rows


def _require_kernels() -> None:
    """Raise, saying what to install, when this environment cannot run notebooks."""
    import importlib.util

    missing = [m for m in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"grading runs notebooks, which needs {', '.join(missing)}: pip install 'fedlearn-edu[coursework]' "
            "(or pip install nbclient nbformat ipykernel)"
        )


def _items_by_notebook(submissions, release) -> dict[str, list]:
    """The graded items of each notebook name: from the release when given, else from a readable submission."""
    items: dict[str, list] = {}
    for _, path in submissions:
        if path.name in items:
            continue
        trusted = Path(release) / path.name if release else None
        nb = _read(trusted) if trusted and trusted.is_file() else None
        if nb is None and not release:
            nb = next((_read(p) for _, p in submissions if p.name == path.name and _read(p)), None)
        if nb is not None:
            items[path.name] = graded_items(nb)
    return items


def grade(submitted, out, timeout: float = 300, release=None, seed: int | None = None, progress=print) -> list[dict]:
    """Grade every submission; write ``out`` (CSV) and the Markdown summary beside it (``.md``).

    Args:
        submitted: ``submitted/`` (``<student>/<notebook>.ipynb``) or its parent folder.
        out: the CSV to write.
        timeout: seconds per notebook (its cells and the checks).
        release: the folder of the released notebooks: the graded items are read from there
            (else from the submissions themselves).
        seed: the hidden cases' seed (default: a fresh random one, never in the release).
        progress: called with one line per notebook graded (``None``: quiet).

    Returns:
        The CSV's rows, as dicts.
    """
    submissions = find_submissions(submitted)
    items = _items_by_notebook(submissions, release)
    hidden = seed if seed is not None else 1 + secrets.randbelow(2**31 - 2)
    seeds = [0, hidden]
    all_rows = []
    for k, (student, path) in enumerate(submissions, 1):
        start = time.perf_counter()
        graded = items.get(path.name, [])
        rows = grade_notebook(path, graded, seeds, timeout) if graded else []
        if not graded:
            rows = [
                {
                    "exercise": "",
                    "points": 0.0,
                    "max_points": 0.0,
                    "status": "error",
                    "mistakes": [],
                    "message": "no graded exercise found for this notebook (not a release of `assign`?)",
                }
            ]
        for row in rows:
            all_rows.append({"student": student, "notebook": path.name, **row})
        if progress:
            got, most = sum(r["points"] for r in rows), sum(r["max_points"] for r in rows)
            statuses = ", ".join(f"{n} {s}" for s, n in Counter(r["status"] for r in rows).items())
            took = time.perf_counter() - start
            progress(
                f"[{k}/{len(submissions)}] {student}/{path.name}: {got:g}/{most:g} points ({statuses}; {took:.1f} s)"
            )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(all_rows)
    out.with_suffix(".md").write_text(summary(all_rows), encoding="utf-8")
    return all_rows


def summary(rows: list[dict]) -> str:
    """The Markdown summary of graded rows.

    Per exercise the class mean and the statuses, the mistakes the checkers named most often,
    per student the total.

    Args:
        rows: :func:`grade`'s rows (with their ``mistakes``).

    Returns:
        The Markdown text.
    """
    lines = [
        "# Grades",
        "",
        "| notebook | exercise | mean points | max | " + " | ".join(STATUSES) + " |",
        "|---" * (4 + len(STATUSES)) + "|",
    ]
    keys = list(dict.fromkeys((r["notebook"], r["exercise"]) for r in rows))
    for nb, ex in keys:
        these = [r for r in rows if (r["notebook"], r["exercise"]) == (nb, ex)]
        counts = Counter(r["status"] for r in these)
        mean = sum(float(r["points"]) for r in these) / len(these)
        lines.append(
            f"| {nb} | {ex} | {mean:.2f} | {float(these[0]['max_points']):g} | "
            + " | ".join(str(counts.get(s, 0)) for s in STATUSES)
            + " |"
        )
    lines += ["", "## Most common mistakes (named by the checkers)", ""]
    named = Counter((r["exercise"], m) for r in rows for m in r.get("mistakes", []))
    lines += [f"- {ex}: {m} ({n} student{'s' if n > 1 else ''})" for (ex, m), n in named.most_common(10)] or [
        "- none named"
    ]
    lines += ["", "## Students", "", "| student | points | max |", "|---|---|---|"]
    for student in dict.fromkeys(r["student"] for r in rows):
        mine = [r for r in rows if r["student"] == student]
        lines.append(
            f"| {student} | {sum(float(r['points']) for r in mine):g} | {sum(float(r['max_points']) for r in mine):g} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])))

"""Scoring inside the student's kernel: each graded function against its checker's public and hidden cases.

:func:`score` runs after the student's notebook, in the same kernel, and prints one JSON line per
graded item (``grade`` reads them from the cell's output). The cases are recorded with
:func:`fedlearn_edu.exercises.recorded_cases`; the public ones are the checker's defaults
(``seed=0``, what the student saw), the hidden ones the same checker with the grader's secret seed.

An answer is **flagged** when it is the package's own implementation, or calls a function of
the package that the checker itself called to compute the expected values (the reference):
calls are watched with ``sys.setprofile`` while the checker runs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

__all__ = ["MARK", "score", "score_item"]

MARK = "FEDLEARN-GRADE "  # the prefix of the printed result lines
PACKAGE = str(Path(__file__).resolve().parents[1])
EXERCISES = str(Path(__file__).resolve().parents[1] / "exercises.py")
MISTAKE = re.compile(r"hint: your output is what (?P<what>.+) gives")


def _name(code) -> str:
    module = Path(code.co_filename).resolve().relative_to(PACKAGE).with_suffix("")
    return "fedlearn_edu." + ".".join(module.parts) + "." + code.co_qualname


def _watch(checker, function, seed):
    """Run ``checker(function, seed=seed)``; return (results, names of the references the answer called)."""
    from ..exercises import recorded_cases

    reference, called = set(), set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE) or code.co_filename == EXERCISES:
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back else ""
        if caller == EXERCISES:
            reference.add(code)
        elif not caller.startswith(PACKAGE):
            called.add(code)

    with recorded_cases() as results:
        old = sys.getprofile()
        sys.setprofile(profile)
        try:
            checker(function, seed=seed)
        finally:
            sys.setprofile(old)
    return results, sorted(_name(c) for c in called & reference)


def score_item(checker, function, points: float, seeds) -> dict:
    """Score one function: partial credit per case over the public and hidden cases.

    Args:
        checker: a checker of :mod:`fedlearn_edu.exercises`.
        function: the student's function.
        points: what every case passing is worth.
        seeds: the public seed, then the hidden one(s).

    Returns:
        ``{"points", "status", "message", "mistakes", "passed", "cases"}``; ``status`` is ``ok``,
        ``failed``, ``not_implemented`` or ``flagged``.
    """
    own = getattr(function, "__module__", None) or ""
    if own.split(".")[0] == "fedlearn_edu":
        return _flagged(f"{function.__module__}.{getattr(function, '__qualname__', function)}", points)
    results, flagged = [], set()
    for k, seed in enumerate(seeds):
        got, refs = _watch(checker, function, seed)
        for r in got:
            r.case = r.case if k == 0 else f"hidden: {r.case}"
        results.extend(got)
        flagged.update(refs)
    if flagged:
        return _flagged(", ".join(sorted(flagged)), points)
    passed = sum(r.passed for r in results)
    failures = [r for r in results if not r.passed]
    mistakes = sorted({m.group("what") for r in failures for m in MISTAKE.finditer(r.message)})
    if results and all(r.raised == "NotImplementedError" for r in results):
        status, message = "not_implemented", "not implemented (raise NotImplementedError())"
    else:
        status = "ok" if not failures else "failed"
        first = failures[0] if failures else None
        message = "" if first is None else _short(first)
    if status == "not_implemented":
        passed = 0
    return {
        "points": round(points * passed / max(len(results), 1), 4),
        "status": status,
        "message": message[:500],
        "mistakes": mistakes,
        "passed": passed,
        "cases": len(results),
    }


def _short(result) -> str:
    """A failure in one line: the case, what went wrong, and the checker's hints."""
    lines = result.message.splitlines()
    hints = [line.strip() for line in lines[1:] if line.strip().startswith("hint:")]
    return " | ".join([f"[{result.case}] {lines[0] if lines else ''}", *hints])


def _flagged(what: str, points: float) -> dict:
    message = f"calls the package's own implementation ({what}) instead of writing it"
    return {"points": 0.0, "status": "flagged", "message": message, "mistakes": [], "passed": 0, "cases": 0}


def score(items: list[dict], namespace: dict, seeds) -> None:
    """Print one result line (``MARK`` + JSON) per graded item.

    Args:
        items: ``{"grade_id", "checker", "function", "points"}`` per graded item.
        namespace: the student's kernel's globals, where the functions are.
        seeds: the public seed, then the hidden one.
    """
    from .. import exercises

    for item in items:
        function = namespace.get(item["function"])
        if not callable(function):
            result = {
                "points": 0.0,
                "status": "failed",
                "message": f"{item['function']} is not defined (or not a function) after the notebook ran",
                "mistakes": [],
            }
        else:
            try:
                result = score_item(getattr(exercises, item["checker"]), function, item["points"], seeds)
            except Exception as err:  # a checker crashed on this answer: report it, grade the others
                result = {"points": 0.0, "status": "failed", "message": f"{type(err).__name__}: {err}", "mistakes": []}
        print(MARK + json.dumps({"grade_id": item["grade_id"], **result}), flush=True)

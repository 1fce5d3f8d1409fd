"""Grading a class: the layout, the statuses, the CSV and its summary; end to end with kernels in the slow tier."""

import csv
import json
import shutil
import time
from pathlib import Path

import pytest

from fedlearn_edu.coursework import assign, find_submissions, grade
from fedlearn_edu.coursework.grading import COLUMNS, summary
from tests.coursework.fixture import ANSWERS, answered, chapter, write

LIMIT = 60  # seconds per notebook: a fixture notebook takes ~6 s alone, ~25 s on a busy 2-core machine
BOOK = Path(__file__).resolve().parents[2] / "book"


def _release(tmp_path):
    ((source, release),) = assign([write(tmp_path / "fixture.ipynb", chapter())], tmp_path / "ps")
    return source, release


def test_submissions_are_found_under_submitted_or_its_parent(tmp_path):
    _, release = _release(tmp_path)
    for student in ("bob", "alice"):
        (tmp_path / "course" / "submitted" / student).mkdir(parents=True)
        shutil.copy(release, tmp_path / "course" / "submitted" / student / "fixture.ipynb")
    (tmp_path / "course" / "submitted" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "course" / "submitted" / "bob" / ".ipynb_checkpoints").mkdir()
    shutil.copy(release, tmp_path / "course" / "submitted" / "bob" / ".ipynb_checkpoints" / "fixture.ipynb")
    (tmp_path / "course" / "submitted" / "carol" / "ps1").mkdir(parents=True)  # nbgrader's <student>/<assignment>/
    shutil.copy(release, tmp_path / "course" / "submitted" / "carol" / "ps1" / "fixture.ipynb")
    found = find_submissions(tmp_path / "course")
    assert [(s, p.parent.name) for s, p in found] == [("alice", "alice"), ("bob", "bob"), ("carol", "ps1")]
    assert found == find_submissions(tmp_path / "course" / "submitted")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        find_submissions(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no <student>/<notebook>.ipynb"):
        find_submissions(tmp_path / "ps" / "source")


def test_a_file_that_is_not_a_notebook_is_an_error_row_and_a_summary(tmp_path):
    _, release = _release(tmp_path)
    (tmp_path / "submitted" / "carol").mkdir(parents=True)
    (tmp_path / "submitted" / "carol" / "fixture.ipynb").write_text("my answers are in the e-mail")
    lines = []
    rows = grade(tmp_path / "submitted", tmp_path / "grades.csv", release=release.parent, progress=lines.append)
    assert [(r["student"], r["exercise"], r["status"], r["points"], r["max_points"]) for r in rows] == [
        ("carol", "ex-fx-weights", "error", 0.0, 2.0)
    ]
    with open(tmp_path / "grades.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == COLUMNS and table[0]["message"].startswith("not a Jupyter notebook")
    assert "| fixture.ipynb | ex-fx-weights | 0.00 | 2 |" in (tmp_path / "grades.md").read_text()
    assert lines == ["[1/1] carol/fixture.ipynb: 0/2 points (1 error; 0.0 s)"]


def test_summary_names_the_class_mean_and_the_mistakes():
    rows = [
        {
            "student": s,
            "notebook": "n.ipynb",
            "exercise": "ex",
            "points": p,
            "max_points": 2.0,
            "status": st,
            "mistakes": m,
        }
        for s, p, st, m in (
            ("a", 2.0, "ok", []),
            ("b", 0.5, "failed", ["the plain mean"]),
            ("c", 0.5, "failed", ["the plain mean"]),
        )
    ]
    text = summary(rows)
    assert "| n.ipynb | ex | 1.00 | 2 | 1 | 2 | 0 | 0 | 0 | 0 |" in text
    assert "- ex: the plain mean (2 students)" in text
    assert "| a | 2 | 2 |" in text


@pytest.mark.book
def test_a_class_end_to_end(tmp_path):
    """assign -> release and source handed in with typical answers; every status, in one grade run."""
    import nbformat
    from nbclient import NotebookClient

    source, release = _release(tmp_path)
    release_nb = json.loads(release.read_text())
    NotebookClient(nbformat.reads(release.read_text(), as_version=4), timeout=120).execute()  # runs top to bottom
    sub = tmp_path / "submitted"
    for name in ("plain_mean", "hangs", "flagged", "hard_coded"):
        write(sub / name / "fixture.ipynb", answered(release_nb, ANSWERS[name]))
    write(sub / "untouched" / "fixture.ipynb", release_nb)
    write(sub / "instructor" / "fixture.ipynb", json.loads(source.read_text()))
    (sub / "not_a_notebook").mkdir()
    (sub / "not_a_notebook" / "fixture.ipynb").write_text("lost my work")
    times = {}

    def progress(line):
        times[line.split("]")[1].split("/")[0].strip()] = time.monotonic()
        print(line)

    start = time.monotonic()
    rows = grade(sub, tmp_path / "grades.csv", timeout=LIMIT, release=release.parent, seed=123, progress=progress)
    got = {r["student"]: r for r in rows}
    assert (got["instructor"]["status"], got["instructor"]["points"]) == ("ok", 2.0)
    assert (got["untouched"]["status"], got["untouched"]["points"]) == ("not_implemented", 0.0)
    assert got["plain_mean"]["status"] == "failed" and 0 < got["plain_mean"]["points"] < 2.0
    assert "the plain mean over clients (the weights ignored)" in got["plain_mean"]["message"]
    assert got["hard_coded"]["status"] == "failed" and got["hard_coded"]["points"] < 2.0
    assert got["hangs"]["status"] == "timeout"
    assert got["flagged"]["status"] == "flagged" and "fedlearn_edu.aggregators" in got["flagged"]["message"]
    assert got["not_a_notebook"]["status"] == "error"
    # the hanging notebook was stopped at its limit, and the next student was still graded
    before = max(t for s, t in times.items() if s < "hangs") if any(s < "hangs" for s in times) else start
    assert times["hangs"] - before < LIMIT + 30
    assert times["hard_coded"] > times["hangs"]


@pytest.mark.book
def test_chapter_one_assign_then_grade(tmp_path):
    ((source, release),) = assign([BOOK / "ch01_fedavg.ipynb"], tmp_path / "ps")
    chapter_text = json.loads((BOOK / "ch01_fedavg.ipynb").read_text())
    released = "\n".join("".join(c["source"]) for c in json.loads(release.read_text())["cells"])
    assert "return p @ deltas" not in released and "raise NotImplementedError()" in released
    assert chapter_text["cells"]  # the chapter itself is left as it is (assign reads it only)
    sub = tmp_path / "submitted"
    write(sub / "instructor" / "ch01_fedavg.ipynb", json.loads(source.read_text()))
    write(sub / "student" / "ch01_fedavg.ipynb", json.loads(release.read_text()))
    rows = grade(sub, tmp_path / "grades.csv", timeout=900, release=release.parent, seed=7)
    got = {(r["student"], r["exercise"]): r for r in rows}
    assert (got["instructor", "ex-ch1-weights"]["status"], got["instructor", "ex-ch1-weights"]["points"]) == ("ok", 1.0)
    assert got["student", "ex-ch1-weights"]["status"] == "not_implemented"

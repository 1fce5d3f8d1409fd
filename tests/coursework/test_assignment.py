"""The source and release of a chapter: nbgrader regions and metadata, no solution left in the release."""

import json

import pytest

from fedlearn_edu.coursework.assignment import (
    BEGIN,
    END,
    GIVEN_AWAY,
    assign,
    graded_items,
    release_notebook,
    source_notebook,
)
from tests.coursework.fixture import SOLUTION_LINES, chapter, write


def _text(nb):
    return "\n".join("".join(c["source"]) for c in nb["cells"])


def _cells(nb, **nbgrader):
    return [c for c in nb["cells"] if all(c["metadata"].get("nbgrader", {}).get(k) == v for k, v in nbgrader.items())]


def test_source_marks_every_solution_line_between_begin_and_end():
    source = source_notebook(chapter())
    regions = []
    for cell in _cells(source, solution=True):
        lines, depth = "".join(cell["source"]).split("\n"), 0
        for line in lines:
            depth += line.strip() == BEGIN
            depth -= line.strip() == END
            if depth:
                regions.append(line.strip())
    for line in SOLUTION_LINES:
        assert line in regions, line
    answer = "".join(_cells(source, solution=True)[0]["source"])
    assert "def my_fedavg(deltas, weights):" in answer.split(BEGIN)[0]  # the signature stays outside
    assert '"""FedAvg\'s weighted mean."""' in answer.split(BEGIN)[0]  # ... with the docstring


def test_graded_cell_is_locked_with_the_exercises_stars_as_points():
    chap = chapter()
    before = json.dumps(chap)
    source = source_notebook(chap)
    assert json.dumps(chap) == before  # the caller's notebook is left as it is
    (grade,) = [c for c in _cells(source, grade=True) if c["cell_type"] == "code"]
    meta = grade["metadata"]["nbgrader"]
    assert meta == {
        "grade": True,
        "grade_id": "ex-fx-weights",
        "locked": True,
        "points": 2,
        "schema_version": 3,
        "solution": False,
        "task": False,
    }
    assert "check_fedavg(my_fedavg)" in "".join(grade["source"]) and "assert" not in "".join(grade["source"])
    (written,) = [c for c in _cells(source, solution=True) if c["cell_type"] == "markdown"]
    assert written["metadata"]["nbgrader"]["grade"] and written["metadata"]["nbgrader"]["points"] == 0  # by hand
    assert len({c["id"] for c in source["cells"]}) == len(source["cells"])  # nbformat 4.5: an id per cell
    (item,) = graded_items(release_notebook(source))
    assert (item.exercise, item.checker, item.function, item.points) == (
        "ex-fx-weights",
        "check_fedavg",
        "my_fedavg",
        2,
    )


def test_release_has_no_line_of_a_solution_and_stubs_in_their_place():
    release = release_notebook(source_notebook(chapter()))
    text = _text(release)
    for line in SOLUTION_LINES:
        assert line not in text, line
    assert BEGIN not in text and END not in text
    answer = "".join(_cells(release, solution=True)[0]["source"])
    assert "def my_fedavg(deltas, weights):\n" in answer and "    raise NotImplementedError()" in answer
    whole = [c for c in _cells(release, solution=True) if c["cell_type"] == "code"][1]
    assert "".join(whole["source"]) == "# YOUR CODE HERE\nraise NotImplementedError()"
    assert "raises-exception" in whole["metadata"]["tags"]  # a top-to-bottom run goes on past it
    assert all(not c.get("outputs") for c in release["cells"] if c["cell_type"] == "code")


def test_release_prose_quoting_a_solutions_glued_number_is_generic():
    release = release_notebook(source_notebook(chapter()))
    text = _text(release)
    assert "`fx-spread" not in text
    assert f"The spread is {GIVEN_AWAY}." in text


def test_assign_writes_source_and_release(tmp_path):
    path = write(tmp_path / "fixture.ipynb", chapter())
    ((source, release),) = assign([path], tmp_path / "ps")
    assert source == tmp_path / "ps" / "source" / "fixture.ipynb"
    assert release == tmp_path / "ps" / "release" / "fixture.ipynb"
    assert json.loads(release.read_text())["metadata"]["fedlearn_edu"] == {"coursework": "release"}


def test_assign_refuses_what_is_not_a_chapter(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such notebook"):
        assign([tmp_path / "missing.ipynb"], tmp_path / "ps")
    (tmp_path / "bad.ipynb").write_text("not json")
    with pytest.raises(ValueError, match="not a Jupyter notebook"):
        assign([tmp_path / "bad.ipynb"], tmp_path / "ps")
    plain = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["no exercise"]}], "metadata": {}}
    with pytest.raises(ValueError, match="no exercise with a solution"):
        assign([write(tmp_path / "plain.ipynb", plain)], tmp_path / "ps")

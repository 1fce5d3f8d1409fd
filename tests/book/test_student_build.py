"""The student build (book/_ext/student_build.py): the book with its exercises' solutions hidden."""

import html
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.coursework.fixture import SOLUTION_LINES, chapter, write

EXT = Path(__file__).resolve().parents[2] / "book" / "_ext"
sys.path.insert(0, str(EXT))
import student_build  # noqa: E402


def _config(**kw):
    return SimpleNamespace(
        hide_solutions=False, html_copy_source=True, html_theme_options={"launch_buttons": {"x": 1}}, **kw
    )


def test_the_variable_or_hide_solutions_turns_the_student_build_on(monkeypatch):
    monkeypatch.delenv(student_build.ENV, raising=False)
    off = _config()
    student_build._configure(None, off)
    assert not off.fedlearn_hide_solutions and off.html_copy_source and off.html_theme_options["launch_buttons"]
    monkeypatch.setenv(student_build.ENV, "1")
    theirs = {"launch_buttons": {"x": 1}}
    on = _config()
    on.html_theme_options = theirs
    student_build._configure(None, on)
    assert on.fedlearn_hide_solutions and not on.hide_solutions  # sphinx-exercise's own is off: it breaks gated ones
    assert not on.html_copy_source and on.html_theme_options["launch_buttons"] == {}
    assert on.html_theme_options["use_download_button"] is False and theirs == {"launch_buttons": {"x": 1}}
    monkeypatch.delenv(student_build.ENV)
    by_setting = _config()
    by_setting.hide_solutions = True
    student_build._configure(None, by_setting)
    assert by_setting.fedlearn_hide_solutions


@pytest.mark.book
def test_a_small_book_built_for_students_has_its_exercises_and_no_solution(tmp_path):
    write(tmp_path / "ch.ipynb", chapter())
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: ch\n")
    (tmp_path / "_config.yml").write_text(
        "title: tiny\nexecute:\n  execute_notebooks: 'off'\nsphinx:\n  extra_extensions:\n    - sphinx_exercise\n"
        f"  local_extensions:\n    student_build: {EXT}\n"
    )
    jb = Path(sys.executable).parent / "jupyter-book"
    env = {"FEDLEARN_HIDE_SOLUTIONS": "1", "PATH": str(Path(sys.executable).parent)}
    subprocess.run([str(jb), "build", str(tmp_path)], check=True, capture_output=True, env=env, timeout=600)
    page = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "_build" / "html" / "ch.html").read_text()))
    assert "Weighted mean" in page and "A spread" in page  # the exercises
    for line in SOLUTION_LINES:
        assert line not in page, line
    assert not (tmp_path / "_build" / "html" / "_sources").exists()

"""Coursework from the book's chapters: set a problem set, grade a class.

``python -m fedlearn_edu assign CHAPTER.ipynb --out DIR`` writes the instructor's source and
the students' release of each chapter (nbgrader formats, :mod:`~fedlearn_edu.coursework.assignment`);
``python -m fedlearn_edu grade SUBMITTED --out grades.csv`` runs every student's notebook in a
kernel of its own and scores each graded function with its checker, public and hidden cases,
partial credit per case (:mod:`~fedlearn_edu.coursework.grading`). The book's page
"For instructors" walks through both.
"""

from .assignment import GradedItem, assign, graded_items, release_notebook, source_notebook
from .grading import STATUSES, find_submissions, grade, grade_notebook
from .notebook import split_solutions

__all__ = [
    "GradedItem",
    "STATUSES",
    "assign",
    "find_submissions",
    "grade",
    "grade_notebook",
    "graded_items",
    "release_notebook",
    "source_notebook",
    "split_solutions",
]

"""How a chapter marks its exercises' solutions, read once for the book and for coursework.

A chapter opens a solution with a ``{solution-start} LABEL`` directive and closes it with
``{solution-end}`` (sphinx-exercise's gated solutions), each in a Markdown cell; every cell
between them, Markdown or code, is the solution. The reader's copies (``book/_ext/reader_copies.py``)
and the coursework (:mod:`fedlearn_edu.coursework.assignment`) both split the chapters with
:func:`split_solutions`.
"""

from __future__ import annotations

import re

__all__ = ["SOLUTION_START", "SOLUTION_END", "cell_source", "split_solutions"]

SOLUTION_START = re.compile(r"^[ \t]*(`{3,}|:{3,})[ \t]*\{solution-start\}[ \t]*(?P<arg>\S*)", re.M)
SOLUTION_END = re.compile(r"^[ \t]*(`{3,}|:{3,})[ \t]*\{solution-end\}", re.M)


def cell_source(cell: dict) -> str:
    """A notebook cell's source as one string (nbformat allows a string or a list of lines).

    Args:
        cell: the cell, as ``json.load`` reads it.

    Returns:
        Its source, one string.
    """
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def split_solutions(text: str, inside: str | None) -> tuple[list[tuple[str, str | None]], str | None]:
    r"""Split a Markdown cell's text at its ``solution-start`` / ``solution-end`` markers.

    The markers (with their directive's options and closing fence) are dropped.

    Args:
        text: the cell's Markdown.
        inside: the label of the solution open before this cell (``""`` for a solution without a
            label), ``None`` outside solutions.

    Returns:
        ``(pieces, inside_after)``: ``pieces`` lists ``(text, label)`` in order, ``label`` being
        the solution the piece belongs to (``None`` for text outside solutions); ``inside_after``
        is the state after the cell, to pass with the next one.

    Example:
        >>> md = "Exercise.\n\n````{solution-start} ex-1\n:class: dropdown\n````\nAnswer.\n"
        >>> split_solutions(md, None)
        ([('Exercise.\n\n', None), ('Answer.\n', 'ex-1')], 'ex-1')
    """
    pieces: list[tuple[str, str | None]] = []
    while True:
        start, end = SOLUTION_START.search(text), SOLUTION_END.search(text)
        marks = [m for m in (start, end) if m]
        if not marks:
            break
        mark = min(marks, key=lambda m: m.start())
        before, after = text[: mark.start()], text[mark.end() :]
        pieces.append((before, inside))
        # the marker's closing fence follows on its own line
        fence = mark.group(1)
        close = re.search(rf"^[ \t]*{re.escape(fence)}[ \t]*$", after, re.M)
        text = after[close.end() :].removeprefix("\n") if close else after
        inside = start.group("arg") if mark is start else None
    pieces.append((text, inside))
    return pieces, inside

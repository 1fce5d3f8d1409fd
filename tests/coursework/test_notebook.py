"""Splitting a chapter's Markdown at its solution markers (shared with the reader's copies)."""

from fedlearn_edu.coursework.notebook import cell_source, split_solutions


def test_a_cell_that_ends_one_solution_and_starts_the_next():
    md = (
        "Last words of the first answer.\n\n````{solution-end}\n````\n\n"
        "```{exercise} Next\n:label: ex-2\n```\n\n````{solution-start} ex-2\n:class: dropdown\n````\nFirst of ex-2."
    )
    pieces, inside = split_solutions(md, "ex-1")
    assert [label for _, label in pieces] == ["ex-1", None, "ex-2"]
    assert pieces[0][0].strip() == "Last words of the first answer."
    assert "{exercise} Next" in pieces[1][0] and "solution" not in pieces[1][0]
    assert pieces[2][0].strip() == "First of ex-2."
    assert inside == "ex-2"


def test_no_marker_keeps_the_state():
    assert split_solutions("plain text", "ex-1") == ([("plain text", "ex-1")], "ex-1")
    assert split_solutions("plain text", None) == ([("plain text", None)], None)


def test_cell_source_reads_both_forms():
    assert cell_source({"source": ["a\n", "b"]}) == cell_source({"source": "a\nb"}) == "a\nb"

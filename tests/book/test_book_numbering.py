"""The book is numbered as one book: chapter N is ``book/chNN_*.ipynb`` everywhere.

* ``_toc.yml`` numbers every part that holds a chapter, in the order of the chapters' file
  names, and ``html.use_multitoc_numbering`` numbers on across the parts, so the sidebar, the
  chapter titles and every figure, equation and exercise label ("Fig. 8.1", "(9.2)",
  "Exercise 8.3") carry the number of the file. An unnumbered part would show "Fig. 1".
* The pages that name chapters by number (README, intro, notation, How to run, API) name
  chapters that exist, and where they name a chapter beside its link, the two agree.
* The intro, the reading paths and the chapter-local notation cover every chapter; the glossary
  defines the words of chapters 9 and 10.
* The book's text holds no control character (a ``\\b`` of ``\\bar`` eaten by a string escape).

All but the last test read files only; the last one reads the built book (``book`` marker).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "book"
PAGES = [REPO / "README.md", *(BOOK / f"{name}.md" for name in ("intro", "notation", "how_to_run", "api"))]


def _yaml(path: Path):
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _parts() -> list[dict]:
    return _yaml(REPO / "_toc.yml")["parts"]


CHAPTER_FILE = re.compile(r"ch(\d\d)_\w+")  # a chapter's file name, chNN_name, without its suffix


def _is_chapter(entry: dict) -> bool:
    """A chapter is a notebook named ``chNN_name``; other notebook pages (the closing page) are not numbered."""
    path = REPO / entry["file"]
    return bool(CHAPTER_FILE.fullmatch(path.name)) and path.with_suffix(".ipynb").is_file()


def _chapters() -> list[str]:
    """The chapter notebooks in the order of ``_toc.yml``, as ``book/chNN_name``."""
    return [entry["file"] for part in _parts() for entry in part["chapters"] if _is_chapter(entry)]


def _number(doc: str) -> int:
    match = CHAPTER_FILE.fullmatch(Path(doc).name)
    assert match, f"{doc}: a chapter's file is named chNN_name"
    return int(match.group(1))


def _title(doc: str) -> str:
    cells = json.loads((REPO / doc).with_suffix(".ipynb").read_text(encoding="utf-8"))["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    return re.search(r"^# (.+)$", first, re.M).group(1).strip()


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _named_numbers(text: str) -> set[int]:
    """Chapter numbers a text names: "chapter 5", "chapters 2–7", "chapters 5 and 6", "Ch. 8", "ch. 5, 6"."""
    numbers: set[int] = set()
    for group in re.findall(r"\b(?:[Cc]hapters?|[Cc]h\.)\s+((?:\d+(?:\s*(?:–|-|,|and|or|to)\s*)?)+)", text):
        for a, b in re.findall(r"(\d+)\s*(?:(?:–|-|to)\s*(\d+))?", group):
            numbers.update(range(int(a), int(b or a) + 1))
    return numbers


# --------------------------------------------------------------------------
# the table of contents


def test_named_numbers_are_read_from_a_text():
    assert _named_numbers("chapter 1 first, then chapters 2–6 in any order") == {1, 2, 3, 4, 5, 6}
    assert _named_numbers("Chapters 2 to 4 and chapter 9; ch. 4, 5: scores; Ch. 7") == {2, 3, 4, 5, 7, 9}


def test_toc_numbers_the_chapters_in_the_order_of_their_file_names():
    chapters = _chapters()
    assert [_number(doc) for doc in chapters] == list(range(1, len(chapters) + 1)), (
        f"_toc.yml lists the chapters as {chapters}: the sidebar numbers them in that order, so chapter N "
        "must be book/chNN_*.ipynb"
    )
    for part in _parts():
        has_chapters = any(_is_chapter(entry) for entry in part["chapters"])
        assert part.get("numbered", False) == has_chapters, (
            f"part {part['caption']!r}: a part that holds chapters is numbered (an unnumbered one shows "
            "'Fig. 1', '(1)', 'Exercise 1' and shifts the numbers after it), a reference part is not"
        )
        assert all(_is_chapter(entry) for entry in part["chapters"]) or not has_chapters, (
            f"part {part['caption']!r} mixes chapters and reference pages"
        )
    for part in _parts():
        for entry in part["chapters"] if not part.get("numbered", False) else ():
            page = (REPO / entry["file"]).with_suffix(".ipynb")
            if page.is_file():  # an unnumbered notebook page would label its figures "Fig. 1", "(1)", "Exercise 1"
                cells = json.loads(page.read_text(encoding="utf-8"))["cells"]
                text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
                labelled = [m for m in ("{figure", "{math}", "$$", "{exercise", "{solution") if m in text]
                labelled += ["a glued figure"] * any("figure" in c.get("metadata", {}).get("mystnb", {}) for c in cells)
                assert not labelled, f"{entry['file']} is not numbered but has numbered elements: {labelled}"
    config = _yaml(REPO / "_config.yml")
    assert config["html"].get("use_multitoc_numbering") is True, (
        "without html.use_multitoc_numbering every part restarts at 1"
    )


def test_readme_lists_the_chapters_in_the_book_order():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^(\d+)\. \[(.+)\]\((book/ch\d\d_\w+)\.ipynb\)$", readme, re.M)
    expected = [(str(i), _title(doc), doc) for i, doc in enumerate(_chapters(), start=1)]
    assert listed == expected, "the README's list of chapters (number, title, file) differs from _toc.yml"


# --------------------------------------------------------------------------
# chapter numbers in the pages


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_name_only_chapters_that_exist(page: Path):
    named = _named_numbers(page.read_text(encoding="utf-8"))
    assert named <= set(range(1, len(_chapters()) + 1)), f"{page.name} names chapters {sorted(named)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_chapter_named_beside_its_link_has_the_link_s_number(page: Path):
    """ "chapter 9 ({doc}`ch09_compare`)", "chapter 9, *Comparing the methods* (`book/ch09_compare.ipynb`)"."""
    text = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))
    pairs = re.findall(r"\b[Cc]hapter (\d+)[^.;:]{0,60}?[`/](ch\d\d_\w+)\b", text)
    for number, doc in pairs:
        assert int(number) == _number(doc), f"{page.name}: chapter {number} beside a link to {doc}"


def test_intro_says_what_every_chapter_teaches():
    intro = (BOOK / "intro.md").read_text(encoding="utf-8")
    teaches = _section(intro, "What the book teaches")
    linked = {_number(doc) for doc in re.findall(r"\{doc\}`(ch\d\d_\w+)`", teaches)}
    chapters = {_number(doc) for doc in _chapters()}
    assert linked == chapters, (
        f"'What the book teaches' links chapters {sorted(linked)}, the book has {sorted(chapters)}"
    )
    assert _named_numbers(_section(intro, "Notation")) == chapters, "the intro's summary of the reading paths"


def test_reading_paths_and_local_notation_cover_every_chapter():
    notation = (BOOK / "notation.md").read_text(encoding="utf-8")
    chapters = [_number(doc) for doc in _chapters()]
    paths = _section(notation, "Reading paths")
    assert _named_numbers(paths) == set(chapters), "the reading paths (diagram and text) miss a chapter"
    diagram = re.search(r"```text\n(.*?)```", paths, re.S).group(1)
    assert sorted({int(n) for n in re.findall(r"Ch\. (\d+) ", diagram)}) == chapters
    local = re.findall(r"^### Chapter (\d+) \(", _section(notation, "Chapter-local symbols"), re.M)
    assert [int(n) for n in local] == chapters, "one table of chapter-local symbols per chapter, in order"


def test_glossary_defines_the_words_of_chapters_9_and_10():
    glossary = _section((BOOK / "notation.md").read_text(encoding="utf-8"), "Glossary")
    terms = set(re.findall(r"^(\S[^\n]*)\n: ", glossary, re.M))
    for term in (
        "Breakdown point",
        "Byzantine client",
        "Differential privacy (client-level)",
        "Equivalent",
        "Inconclusive",
        "Secure aggregation",
    ):
        assert term in terms, f"the glossary has no entry {term!r}"


def test_book_text_has_no_control_characters():
    texts = {p.name: p.read_text(encoding="utf-8") for p in [*PAGES, BOOK / "bibliography.md"]}
    for doc in _chapters():
        cells = json.loads((REPO / doc).with_suffix(".ipynb").read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                texts[f"{doc} cell {i}"] = "".join(cell["source"])
    bad = {
        where: repr(text[max(0, m.start() - 20) : m.end() + 20])
        for where, text in texts.items()
        if (m := re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text))
    }
    assert not bad, f"control characters (an escape eaten from a string, e.g. \\b of \\bar?): {bad}"


# --------------------------------------------------------------------------
# the rendered book


def test_rendered_chapters_carry_the_number_of_their_file(built_book: Path):
    for doc in _chapters():
        page = html.unescape((built_book / f"{doc}.html").read_text(encoding="utf-8"))
        title = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
        assert title.startswith(f"{_number(doc)}. "), f"{doc} renders as {title!r}"
        # the page's own labels: captions (figures, tables, exercises, algorithms, theorems) and equations
        labels = re.findall(r'<span class="caption-number">[^<]*?([\d.]+) ?</span>', page)
        labels += re.findall(r'class="eqno">\(([\d.]+)\)', page)
        prefixes = {label.split(".")[0] if "." in label else "unnumbered" for label in labels}
        assert prefixes == {str(_number(doc))}, f"{doc}: its labels are numbered {sorted(set(labels))}"

"""The book's accessibility fixes of the theme's HTML (book/_ext/accessibility.py); axe-core checks the built
pages in tests/book/test_browser.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "book" / "_ext"))
import accessibility  # noqa: E402

SEARCH = (
    '<button class="btn search-button-field search-button__button pst-js-only" title="Search" aria-label="Search" '
    'data-bs-toggle="tooltip"><span class="search-button__default-text">Search</span></button>'
)
THEME = '<button class="btn btn-sm nav-link pst-navbar-icon theme-switch-button pst-js-only" aria-label="Color mode">'
SUMMARY = (
    '<summary aria-label="Toggle hidden content">\n<p class="collapsed admonition-title">Show code cell source</p>'
)
CITATION = '<div role="list" class="citation-list">\n<div class="citation" id="id29" role="doc-biblioentry">'
ICON_SEARCH = '<button class="btn btn-sm pst-navbar-icon search-button" title="Search" aria-label="Search">'


def test_controls_are_named_by_what_they_show():
    page = accessibility.fix_names(SEARCH + THEME + SUMMARY + ICON_SEARCH + CITATION)
    assert 'aria-label="Search" data-bs-toggle' not in page and "Search</span>" in page
    assert 'aria-label="Color mode"' not in page and "theme-switch-button" in page
    assert "<summary>\n<p" in page and "Toggle hidden content" not in page
    assert ICON_SEARCH in page  # an icon-only button keeps its label: it shows no text
    assert '<div class="citation" id="id29" role="listitem">' in page and "doc-biblioentry" not in page


def test_fix_site_writes_the_css_and_fixes_every_page(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "a.html").write_text(SUMMARY, encoding="utf-8")
    (tmp_path / "b.html").write_text("<p>nothing to fix</p>", encoding="utf-8")
    assert accessibility.fix_site(tmp_path) == 1
    assert (tmp_path / "book" / "a.html").read_text(encoding="utf-8").startswith("<summary>")
    css = (tmp_path / "_static" / accessibility.CSS_FILE).read_text(encoding="utf-8")
    assert "#0a58ca" in css and 'data-theme="light"' in css

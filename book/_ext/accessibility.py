"""Accessibility fixes of the theme's HTML that axe-core reports as serious (the browser test runs it).

* ``label-content-name-mismatch``: a control whose ``aria-label`` does not contain its visible
  text is announced under another name than the one a speech-input user says. The theme's
  search button shows "Search Ctrl+K" under the label "Search", its colour-mode button is
  labelled "Color mode" beside icons titled "Light", "Dark" and "System Settings", and myst-nb's
  hidden-cell toggles show "Show code cell source" under the label "Toggle hidden content".
  Dropping those ``aria-label`` attributes lets each control be named by what it shows.
* ``aria-required-children``: docutils writes a bibliography as ``role="list"`` whose entries carry
  ``role="doc-biblioentry"``, a role ARIA 1.3 deprecates and axe-core no longer counts as a list
  item; the entries become ``role="listitem"`` (each keeps its label and text).
* ``color-contrast``: the theme's link colour on the tinted background of exercises, proofs and
  admonitions has a contrast of 4.3:1, under WCAG AA's 4.5:1; a darker blue there (light mode
  only) has 6:1.
"""

from __future__ import annotations

import re
from pathlib import Path

CSS_FILE = "fedlearn-a11y.css"
CSS = """\
/* fedlearn-edu: links on the tinted boxes meet WCAG AA contrast (4.5:1) in light mode */
html[data-theme="light"] .admonition a,
html[data-theme="light"] div.proof a,
html[data-theme="light"] div.exercise a,
html[data-theme="light"] div.solution a {
  color: #0a58ca;
}
"""

# (what to find, what it becomes): aria-labels that hide a control's visible text from its name
_NAME_FIXES = (
    (
        re.compile(
            r'(<button class="btn search-button-field search-button__button[^"]*" title="Search") aria-label="Search"'
        ),
        r"\1",
    ),
    (re.compile(r'(theme-switch-button[^"]*") aria-label="Color mode"'), r"\1"),
    (re.compile(r'<summary aria-label="Toggle hidden content">'), "<summary>"),
    (re.compile(r'(<div class="citation" id="[^"]*") role="doc-biblioentry"'), r'\1 role="listitem"'),
)


def fix_names(html: str) -> str:
    """``html`` without the ``aria-label`` attributes that contradict their control's visible text."""
    for pattern, repl in _NAME_FIXES:
        html = pattern.sub(repl, html)
    return html


def fix_site(outdir: Path) -> int:
    """Write :data:`CSS` into ``outdir/_static`` and apply :func:`fix_names` to every page; return the
    number of pages changed."""
    static = Path(outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    (static / CSS_FILE).write_text(CSS, encoding="utf-8")
    changed = 0
    for page in Path(outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        fixed = fix_names(text)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")
            changed += 1
    return changed

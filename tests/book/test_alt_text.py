"""Alt text of the book's figures (``book/_ext/fedlearn_book.py``: :func:`alt_from_captions`).

Without one, docutils writes an image's file path as its ``alt`` (``../_images/<hash>.png``), and a
screen reader reads that out. The extension gives every image inside a captioned figure the first
sentence of its caption; a figure cell without a caption can set myst-nb's
``"mystnb": {"image": {"alt": ...}}``. The last test reads the built book (``-m book``).
"""

from __future__ import annotations

import html.parser
import sys
from pathlib import Path

from docutils import nodes

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "book" / "_ext"))
import fedlearn_book as fb  # noqa: E402


def _figure(caption_nodes, alt=None, wrap=True):
    image = nodes.image(uri="../_images/0a1b2c.png", **({"alt": alt} if alt is not None else {}))
    inner = nodes.container("", image, classes=["cell_output"]) if wrap else image
    figure = nodes.figure("", inner)
    if caption_nodes is not None:
        figure += nodes.caption("", "", *caption_nodes)
    return nodes.section("", figure), image


def test_an_image_in_a_captioned_figure_gets_the_caption_s_first_sentence():
    tree, image = _figure(
        [
            nodes.Text("Validation-gradient score "),
            nodes.math("$G_k$", "$G_k$"),
            nodes.Text(" of the clients.  Dotted: "),
        ]
        + [nodes.Text("the mean. Larger clients score lower.")]
    )
    assert fb.alt_from_captions(tree) == []
    assert image["alt"] == "Validation-gradient score G_k of the clients."


def test_a_path_as_alt_text_is_replaced_and_a_real_one_kept():
    tree, image = _figure([nodes.Text("Accuracy per round (e.g. 30 rounds). Left: FedAvg.")], alt="../_images/x.png")
    fb.alt_from_captions(tree)
    assert image["alt"] == "Accuracy per round (e.g. 30 rounds)."  # "e.g. 30" ends no sentence
    tree, image = _figure([nodes.Text("A caption.")], alt="Clients' accuracies as bars", wrap=False)
    fb.alt_from_captions(tree)
    assert image["alt"] == "Clients' accuracies as bars"


def test_an_image_without_a_caption_is_reported():
    tree, image = _figure(None)
    assert fb.alt_from_captions(tree) == [image] and "alt" not in image


class _Images(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.alts: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.alts.append(dict(attrs).get("alt"))


def test_no_image_of_the_built_book_has_a_path_as_alt_text(built_book: Path):
    bad, seen = {}, 0
    for page in sorted(built_book.rglob("*.html")):
        if "_static" in page.parts or "readers" in page.parts:
            continue
        parser = _Images()
        parser.feed(page.read_text(encoding="utf-8"))
        seen += len(parser.alts)
        paths = [a for a in parser.alts if a and fb.PATH_LIKE.search(a)]
        if paths:
            bad[str(page.relative_to(built_book))] = paths
    assert seen >= 20, f"only {seen} images in the built book: is it the book?"
    assert not bad, (
        "images with a file path as alt text (give the figure cell a caption, or "
        f'"mystnb": {{"image": {{"alt": ...}}}}): {bad}'
    )

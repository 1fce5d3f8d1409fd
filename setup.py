"""The parts of the package metadata that pyproject.toml cannot state statically.

The project URLs (the published book, the source, the issue tracker) are derived from the
repository URL in ``_config.yml``, the one place the repository URL is written; the long
description is ``README.md`` with its relative links made absolute (on the package index a link
such as ``book/ch01_fedavg.ipynb`` leads nowhere). Everything else is in ``pyproject.toml``.
"""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import setup


def repository_url(config: Path) -> str:
    """The ``repository: url:`` of a Jupyter Book ``_config.yml`` (read without a YAML parser).

    Args:
        config: path of ``_config.yml``.

    Returns:
        The URL without a trailing slash, e.g. ``"https://github.com/org/repo"``.
    """
    match = re.search(r"^repository:[ \t]*\n(?:[ \t]+.*\n)*?[ \t]+url:[ \t]*(\S+)", config.read_text("utf-8"), re.M)
    if match is None:
        raise RuntimeError(f"{config} has no `repository: url:` entry; the project URLs are derived from it.")
    return match.group(1).strip("\"'").rstrip("/")


def project_urls(repo: str) -> dict[str, str]:
    """Homepage (the GitHub Pages site), source and issues of a GitHub repository URL."""
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+)", repo)
    if match is None:
        raise RuntimeError(f"repository url {repo!r} is not of the form https://github.com/ORG/REPO")
    org, name = match.groups()
    return {
        "Homepage": f"https://{org.lower()}.github.io/{name}/",
        "Documentation": f"https://{org.lower()}.github.io/{name}/",
        "Source": repo,
        "Issues": f"{repo}/issues",
    }


# a Markdown link or image whose target is neither a URL, an anchor nor an e-mail address
RELATIVE_LINK = re.compile(r"(!?\[[^\]\n]*\]\()(?![a-zA-Z][a-zA-Z0-9+.-]*:|#)([^)\s]+)(\))")


def absolute_links(markdown: str, repo: str, ref: str = "main") -> str:
    """``markdown`` with every relative link pointing into the repository on GitHub.

    Args:
        markdown: the text (README.md).
        repo: the repository URL, e.g. ``"https://github.com/org/repo"``.
        ref: the branch or tag the links open.

    Returns:
        The text with ``[text](path)`` turned into ``[text](REPO/blob/REF/path)`` (images:
        ``REPO/raw/REF/path``); URLs and ``#anchors`` are kept.
    """

    def absolute(match: re.Match) -> str:
        opening, target, closing = match.groups()
        kind = "raw" if opening.startswith("!") else "blob"
        return f"{opening}{repo}/{kind}/{ref}/{target.removeprefix('./')}{closing}"

    return RELATIVE_LINK.sub(absolute, markdown)


if __name__ == "__main__":
    root = Path(__file__).resolve().parent
    repo = repository_url(root / "_config.yml")
    setup(
        project_urls=project_urls(repo),
        long_description=absolute_links((root / "README.md").read_text(encoding="utf-8"), repo),
        long_description_content_type="text/markdown",
    )

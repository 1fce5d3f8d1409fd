"""The one part of the package metadata that pyproject.toml cannot state statically.

The project URLs (the published book, the source, the issue tracker) are derived from the
repository URL in ``_config.yml``, the one place the repository URL is written; everything else
is in ``pyproject.toml``.
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


if __name__ == "__main__":
    setup(project_urls=project_urls(repository_url(Path(__file__).resolve().parent / "_config.yml")))

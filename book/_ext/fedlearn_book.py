"""Small Sphinx fixes for the book (a local extension, listed in _config.yml).

1. MathJax is served from the built site itself, so the HTML book reads without internet.
2. Scripts registered twice are written once: with Jupyter Book 1.x, sphinx-thebe's inline
   configuration reaches every page twice, and the second ``const THEBE_JS_URL`` is a
   JavaScript error in the reader's console.
3. On a reader's very first visit, pydata-sphinx-theme reads an empty colour mode from
   ``localStorage`` and logs an error before resetting it to "auto"; an inline script sets
   "auto" first.

MathJax:
MathJax 3 comes from the PyPI package ``django-static-mathjax`` (a plain copy of the
MathJax distribution, installed with the ``book`` extra; it needs no Django). On
``builder-inited`` we point Sphinx's ``mathjax_path`` at ``_static/mathjax/tex-mml-chtml.js``;
on ``build-finished`` we copy the parts of MathJax's ``es5`` folder that page needs (the
combined TeX/MathML-to-CHTML bundle, its fonts and the lazily loaded extensions) into the
output. Without the package the build fails with a message saying what to install.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PARTS = ("tex-mml-chtml.js", "input", "output", "a11y", "ui", "sre", "adaptors")


def _mathjax_es5() -> Path:
    try:
        import mathjax  # installed by django-static-mathjax
    except ImportError as err:  # pragma: no cover - environment problem
        raise RuntimeError(
            "The book serves MathJax offline from the package 'django-static-mathjax'. "
            "Install the book extra: pip install -e '.[book]'"
        ) from err
    root = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (root / PARTS[0]).is_file():
        raise RuntimeError(f"MathJax files not found under {root}; reinstall django-static-mathjax.")
    return root


def _configure(app) -> None:
    _mathjax_es5()
    app.config.mathjax_path = "mathjax/tex-mml-chtml.js"


def _copy(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    src, dest = _mathjax_es5(), Path(app.outdir) / "_static" / "mathjax"
    for part in PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, dirs_exist_ok=True)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / part, dest / part)


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        # Inline scripts carry their code in attributes["body"] and a filename of None or "".
        key = (getattr(js, "filename", str(js)) or "", tuple(sorted((getattr(js, "attributes", None) or {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


DEFAULT_MODE = 'if (!document.documentElement.dataset.mode) { document.documentElement.dataset.mode = "auto"; }'


def setup(app):
    app.connect("builder-inited", _configure)
    app.connect("build-finished", _copy)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.add_js_file(None, body=DEFAULT_MODE, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

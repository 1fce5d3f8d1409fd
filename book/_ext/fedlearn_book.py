"""Small Sphinx fixes for the book (a local extension, listed in _config.yml).

1. MathJax is served from the built site itself, so the HTML book reads without internet.
2. Scripts registered twice are written once: with Jupyter Book 1.x, sphinx-thebe's inline
   configuration reaches every page twice, and the second ``const THEBE_JS_URL`` is a
   JavaScript error in the reader's console.
3. Reader's copies: after an HTML build, every chapter's reader's copy (plain Markdown, no
   MyST; see ``reader_copies.py``) is written to ``_build/html/readers/``, and the Colab and
   Binder launch buttons open those copies (the ``readers`` branch the Pages workflow publishes).
4. On a reader's very first visit, pydata-sphinx-theme reads an empty colour mode from
   ``localStorage`` and logs an error before resetting it to "auto"; an inline script sets
   "auto" first.
5. The chapters' kernels talk to the build over Unix sockets in a folder of the build's own,
   not over TCP ports another process can take before the kernel binds them (see
   ``kernel_transport.py``), and the build waits for their messages a second at a time, so a
   wake-up that pyzmq loses costs a second, not a cell's timeout (see ``kernel_polling.py``).
6. Alt text: an image without one gets, in HTML, its file path as its ``alt`` (docutils'
   default: ``../_images/<hash>.png``), which a screen reader reads out. An image inside a figure
   gets the first sentence of the figure's caption instead (:func:`alt_from_captions`); a
   figure cell without a caption can give its own with myst-nb's cell metadata
   ``"mystnb": {"image": {"alt": "..."}}``. The build lists the images left without one.
7. The theme's controls are named by what they show, and links on tinted boxes have enough
   contrast (``accessibility.py``; axe-core checks every page in the browser test).
8. Data requests: before a page is read (and its notebook executed), ``FEDLEARN_DATA_LOG`` is
   pointed at ``_build/data_requests/<page>.jsonl``, where the package notes every data set
   beyond the bundled ones that the page's kernel asks for, and whether it was found
   (:func:`fedlearn_edu.data.sources.log_request`). A page without a file asked for none, so its
   execution does not depend on which data sets a machine has: the tests execute again, with
   the data, only the reader's copies of the pages that missed one here.
9. A build asked to read pages in parallel (Sphinx's ``parallel``, as the tests' build does; the
   jupyter-book CLI reads one page at a time) does so one page per task, two chapters' kernels
   at a time on two cores (:func:`_read_in_parallel` says what it takes).

MathJax:
MathJax 3 comes from the PyPI package ``django-static-mathjax`` (a plain copy of the
MathJax distribution, installed with the ``book`` extra; it needs no Django). On
``builder-inited`` we point Sphinx's ``mathjax_path`` at ``_static/mathjax/tex-mml-chtml.js``;
on ``build-finished`` we copy the parts of MathJax's ``es5`` folder that page needs (the
combined TeX/MathML-to-CHTML bundle, its fonts and the lazily loaded extensions) into the
output. Without the package the build fails with a message saying what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from docutils import nodes

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accessibility  # noqa: E402  (beside this file)
import kernel_polling  # noqa: E402
import kernel_transport  # noqa: E402
import reader_copies  # noqa: E402  (puts this checkout's fedlearn_edu first on sys.path)

from fedlearn_edu.data.sources import REQUEST_LOG_VAR  # noqa: E402

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


def _accessibility(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        accessibility.fix_site(Path(app.outdir))


def _readers(app, exception) -> None:
    """Write the reader's copies of the chapters (and the ``readers`` branch's Binder files)."""
    if exception is not None or app.builder.format != "html" or app.config.fedlearn_hide_solutions:
        return  # the student build has none: their solutions are collapsed, not gone
    site = app.config.html_baseurl.rstrip("/") + "/"
    chapters = {d: Path(app.env.doc2path(d)) for d in app.env.found_docs if str(app.env.doc2path(d)).endswith(".ipynb")}
    dest = Path(app.outdir) / reader_copies.READERS_DIR
    refs = reader_copies.sphinx_references(app, site)
    repo = app.config.html_theme_options.get("repository_url", "").rstrip("/")
    branch = app.config.html_theme_options.get("repository_branch", "main")
    # the copies and Binder install the commit that built them (the Pages workflow names it)
    ref = reader_copies.build_ref(Path(app.srcdir), branch)
    install = reader_copies.install_cell(repo, ref)
    executed = Path(app.outdir).parent / "jupyter_execute"
    reader_copies.write_reader_copies(chapters, refs, dest, executed=executed, install=install)
    (dest / "requirements.txt").write_text(reader_copies.binder_requirements(repo, ref))
    built_from = f"commit {ref}" if ref != branch else f"branch {branch} (no commit known to the build)"
    (dest / "README.md").write_text(
        "# Reader's copies of the chapters\n\n"
        f"Generated by the book's build from {repo} ({built_from}); do not edit. The book: {site}\n"
    )


def _substitutions(app, config) -> None:
    """Substitutions from the repository URL for the Markdown pages (``{{ colab_example }}`` in How to run)."""
    repo = config.html_theme_options.get("repository_url", "").rstrip("/")
    branch = config.html_theme_options.get("repository_branch", "main")
    example = reader_copies.launch_urls(repo, "book/ch01_fedavg")
    config.myst_substitutions = {
        **config.myst_substitutions,
        "repository_link": f"<{repo}>",
        "git_install": f'`pip install "fedlearn-edu @ git+{repo}@{branch}"`',
        "colab_example": f"<{example['Colab']}>",
        "readers_branch": f"`{reader_copies.READERS_BRANCH}`",
    }


def _launch_readers(app, pagename, templatename, context, doctree) -> None:
    """Point the Colab and Binder buttons of a chapter at its reader's copy."""
    repo = app.config.html_theme_options.get("repository_url", "")
    urls = reader_copies.launch_urls(repo, pagename)
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if isinstance(group, dict) else []:
            if button.get("text") in urls:
                button["url"] = urls[button["text"]]


PATH_LIKE = re.compile(r"\.(png|jpe?g|gif|svg|webp)$|^\.{0,2}/|/_images/", re.I)


def _needs_alt(image: nodes.image) -> bool:
    alt = " ".join(str(image.get("alt", "")).split())
    return not alt or alt == image.get("uri") or bool(PATH_LIKE.search(alt))


def _first_sentence(text: str) -> str:
    text = " ".join(text.replace("$", "").split())  # inline maths as its TeX, without the dollars
    match = re.search(r"(?<=[.!?])\s+(?=[A-Z(])", text)  # a sentence's end: ". " before a capital
    return text[: match.start()] if match else text


def alt_from_captions(doctree: nodes.Node) -> list[nodes.image]:
    """Give every image that has no real alt text the first sentence of its figure's caption.

    Args:
        doctree: a document's tree (``doctree-read``).

    Returns:
        The images still without an alt text (not inside a captioned figure).
    """
    missing = []
    for image in doctree.findall(nodes.image):
        if not _needs_alt(image):
            continue
        figure = image.parent
        while figure is not None and not isinstance(figure, nodes.figure):
            figure = figure.parent
        caption = next(iter(figure.findall(nodes.caption)), None) if figure is not None else None
        text = _first_sentence(caption.astext()) if caption is not None else ""
        if text:
            image["alt"] = text
        else:
            missing.append(image)
    return missing


def _alt_texts(app, doctree, docname) -> None:
    from sphinx.util import logging

    missing = alt_from_captions(doctree)
    if missing:
        logging.getLogger(__name__).info(
            f"{docname}: {len(missing)} image(s) without alt text (no figure caption, no mystnb.image.alt): "
            'give the cell a caption or "mystnb": {"image": {"alt": ...}}'
        )


DEFAULT_MODE = 'if (!document.documentElement.dataset.mode) { document.documentElement.dataset.mode = "auto"; }'


REQUESTS_DIR = "data_requests"


def requests_file(outdir: str | Path, docname: str) -> Path:
    """Where the data requests of page ``docname`` are written: ``<outdir>/../data_requests/<docname>.jsonl``."""
    return Path(outdir).parent / REQUESTS_DIR / f"{docname}.jsonl"


def _log_requests(app, docname, source) -> None:
    # source-read comes before the page is parsed, so before its kernel starts (with this environment)
    path = requests_file(app.outdir, docname)
    path.unlink(missing_ok=True)  # a page read again starts a fresh log
    os.environ[REQUEST_LOG_VAR] = str(path)


# Reading pages in parallel (the tests' build: Sphinx's parallel read, ``jobs`` > 1; jupyter-book's
# CLI builds serially). Three things stop Sphinx from doing it well, fixed for HTML builds only:
# - two extensions jupyter-book adds do not declare whether they are safe in parallel, so Sphinx
#   reads serially: sphinx-multitoc-numbering only renumbers the merged table of contents in the
#   main process, and sphinx-jupyterbook-latex acts only for a LaTeX builder; both are safe;
# - sphinx-proof's domain keeps nothing in its own data (its proofs are in ``env.proof_list``,
#   which sphinx-proof merges on ``env-merge-info``) but does not say how to merge it, so the
#   merge raises: it is given a merge that keeps nothing;
# - Sphinx hands each reading process a fixed slice of the sorted pages (9 of 19 each here), so
#   one process can end with all the long chapters: each page becomes its own task instead, and
#   a process that is done takes the next page.
PARALLEL_SAFE_FOR_HTML = ("sphinx_multitoc_numbering", "sphinx_jupyterbook_latex")


def _merge_nothing(self, docnames, otherdata) -> None:
    """``Domain.merge_domaindata`` for a domain whose data holds nothing per page."""


def _one_page_per_task(arguments, nproc, maxbatch=10):
    return [[a] for a in arguments]


def _read_in_parallel(app) -> None:
    if app.builder.format != "html" or app.parallel <= 1:
        return
    import sphinx.builders
    from sphinx_proof.domain import ProofDomain

    for name in PARALLEL_SAFE_FOR_HTML:
        ext = app.extensions.get(name)
        if ext is not None:
            ext.parallel_read_safe = ext.parallel_write_safe = True
    if "merge_domaindata" not in vars(ProofDomain):
        ProofDomain.merge_domaindata = _merge_nothing
    sphinx.builders.make_chunks = _one_page_per_task


def _link_kernels(app) -> None:
    kernel_transport.use_ipc()
    kernel_polling.poll_in_slices()


def _unlink_kernels(app, exception) -> None:
    kernel_transport.restore()
    kernel_polling.restore()


def setup(app):
    app.setup_extension("student_build")  # FEDLEARN_HIDE_SOLUTIONS=1: the student build (book/instructors.md)
    app.connect("config-inited", _substitutions, priority=900)
    app.connect("builder-inited", _configure)
    app.connect("builder-inited", _link_kernels)
    app.connect("builder-inited", _read_in_parallel)
    app.connect("source-read", _log_requests)
    app.connect("build-finished", _unlink_kernels)
    app.connect("build-finished", _copy)
    app.connect("build-finished", _readers)
    app.connect("build-finished", _accessibility)
    app.add_css_file(accessibility.CSS_FILE)
    app.connect("doctree-resolved", _alt_texts)  # after every transform, glued figures included
    app.connect("html-page-context", _launch_readers, priority=600)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.add_js_file(None, body=DEFAULT_MODE, priority=1)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

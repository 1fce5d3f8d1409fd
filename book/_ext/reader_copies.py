"""Reader's copies of the chapters: notebooks that read well where MyST is not rendered.

The chapters are MyST notebooks: Jupyter Book renders their roles (``{cite}``, ``{numref}``,
``{eq}``, ``{prf:ref}``...), directives (theorems, algorithms, exercises, solutions in dropdowns)
and labels. Plain Jupyter, Colab and JupyterLab without ``jupyterlab-myst`` show all of that raw,
solutions included. A reader's copy is the same notebook with every MyST construct turned into
plain Markdown and LaTeX:

* roles become text and links to the rendered site (``{numref}`fig-x``` -> ``[Fig. 1.2](SITE/...#fig-x)``,
  ``{eq}`` -> ``[(2.1)](...)``, ``{cite}`` -> ``(McMahan et al., 2017)`` linked to the bibliography);
* theorem-like blocks become headed paragraphs (``**Theorem 2.1 (title).**``), admonitions quotes;
* solutions become collapsed ``<details>`` blocks, and the code cells of a solution (between
  ``solution-start`` and ``solution-end``) have their source hidden (JupyterLab's
  ``jupyter.source_hidden``, Colab's form view under a ``# @title`` line) and run inside
  ``fedlearn_edu.exercises.collapsed_output``, which shows their output in a closed ``<details>``
  block (:func:`solution_cell`);
* labelled display maths gets its number as ``\\tag{2.1}``; labels and comments are dropped;
* the cells the rendered page hides (``remove-input``: the glue calls and the checks that guard
  the prose) are kept, collapsed (:func:`_collapse_plumbing`).

The code cells are the chapter's own (the first one is the install cell of :func:`install_cell`).
The book's Sphinx extension (``fedlearn_book.py``) writes the copies at the end of every HTML build
into ``_build/html/readers/`` with the numbers and anchors Sphinx resolved (:func:`sphinx_references`);
the Pages workflow publishes that folder to the ``readers`` branch, which the Colab and Binder
buttons open. ``python book/_ext/reader_copies.py --sync-install-cells`` rewrites the chapters'
first code cells from ``_config.yml`` (the one place the repository URL is written).
"""

from __future__ import annotations

import copy
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

READERS_BRANCH = "readers"  # the branch the Pages workflow publishes the copies to
READERS_DIR = "readers"  # ... from this folder of the built site

# --------------------------------------------------------------------------- #
# the install cell (first code cell of every chapter)

INSTALL_CELL = """\
# Set-up: use fedlearn_edu from this checkout or this environment, else install it (e.g. on Colab).
import importlib.util
import pathlib
import sys

if importlib.util.find_spec("fedlearn_edu") is None and pathlib.Path("../fedlearn_edu").is_dir():
    sys.path.insert(0, str(pathlib.Path("..").resolve()))  # running from a source checkout
if importlib.util.find_spec("fedlearn_edu") is None:
    import importlib.metadata
    import subprocess

    # the exact source this notebook was built from, never a bare name on the package index
    SOURCE = "fedlearn-edu @ git+{repository_url}@{ref}"

    def versions():
        dists = importlib.metadata.distributions()
        return {{(d.metadata["Name"] or "").replace("_", "-").lower(): d.version for d in dists}}

    before = versions()
    print(f"pip install {{SOURCE!r}} ...")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", SOURCE], capture_output=True, text=True)
    if pip.returncode != 0:
        raise RuntimeError(
            "Could not install fedlearn_edu from GitHub; pip said:\\n"
            + pip.stderr[-2000:]
            + "\\nWhat to do: check the internet connection (on Colab: Runtime -> Disconnect and delete "
            "runtime, then run again), or install it yourself in this environment with\\n"
            f"    pip install '{{SOURCE}}'\\n"
            "and run this cell again."
        )
    importlib.invalidate_caches()
    after = versions()
    loaded = {{m.split(".")[0].replace("_", "-").lower() for m in sys.modules}}
    stale = sorted(n for n, v in before.items() if after.get(n) != v and n in loaded)
    if stale:  # the install replaced packages this kernel has already imported
        raise RuntimeError(
            f"fedlearn_edu is installed, but it upgraded {{', '.join(stale)}}, already imported here. "
            "Restart the kernel (Colab: Runtime -> Restart session), then run the notebook again."
        )
import fedlearn_edu  # noqa: E402,F401  (fails here, not one cell later, if the package is unusable)

%matplotlib inline
"""


def install_cell(repository_url: str, ref: str = "main") -> str:
    """Source of the chapters' first code cell.

    It puts the source checkout on ``sys.path`` (a chapter run from ``book/``), else installs
    ``fedlearn-edu`` from the repository at ``ref`` -- never the bare name from the package index,
    where this project has published nothing (whoever registered the name would run their code
    on every reader). It raises with what to do when the install fails (offline), and asks for a
    restart only when the install replaced a package the kernel had already imported.
    ``%matplotlib inline`` keeps the figures inline whatever ``MPLBACKEND`` says.

    The chapters hold the cell for ``_config.yml``'s branch (:func:`sync_install_cells`); each
    reader's copy gets the cell for the commit that built it (:func:`build_ref`).

    Args:
        repository_url: e.g. ``"https://github.com/org/repo"`` (``_config.yml``'s ``repository.url``).
        ref: the commit (or, in the chapters, the branch) pip installs.

    Returns:
        The cell's source, one string.
    """
    return INSTALL_CELL.format(repository_url=repository_url.rstrip("/"), ref=ref)


COMMIT_VARIABLES = ("FEDLEARN_BUILD_COMMIT", "GITHUB_SHA")  # the Pages workflow sets the first
_COMMIT = re.compile(r"[0-9a-f]{40}")


def build_commit(root: Path, environ=None) -> str | None:
    """The commit the book is built from: ``$FEDLEARN_BUILD_COMMIT``, ``$GITHUB_SHA``, else ``git rev-parse HEAD``.

    Args:
        root: the book's root (the repository checkout).
        environ: the environment (default ``os.environ``).

    Returns:
        The full 40-digit commit hash, or ``None`` outside a git checkout with neither variable set.

    Raises:
        ValueError: a variable is set but is not a full commit hash.
    """
    import os
    import subprocess

    environ = os.environ if environ is None else environ
    for name in COMMIT_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            if not _COMMIT.fullmatch(value):
                raise ValueError(f"{name}={value!r} is not a full 40-digit commit hash")
            return value
    try:
        git = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = git.stdout.strip()
    return sha if git.returncode == 0 and _COMMIT.fullmatch(sha) else None


def build_ref(root: Path, branch: str, environ=None) -> str:
    """What the reader's copies and Binder install: the building commit (:func:`build_commit`), else ``branch``."""
    return build_commit(root, environ) or branch


def binder_requirements(repository_url: str, ref: str) -> str:
    """The ``requirements.txt`` of the ``readers`` branch: the package at ``ref`` with CPU PyTorch."""
    return (
        "# Binder: the environment of the reader's copies (CPU PyTorch keeps the image small)\n"
        "--extra-index-url https://download.pytorch.org/whl/cpu\n"
        f"fedlearn-edu @ git+{repository_url.rstrip('/')}@{ref}\n"
        "ipywidgets>=7  # the chapters' sliders (the package never imports it)\n"
        "jupyterlab-myst\n"
    )


def book_config(root: Path) -> dict:
    """``repository_url``, ``branch`` and ``site_url`` from the book's ``_config.yml``."""
    import yaml

    cfg = yaml.safe_load((Path(root) / "_config.yml").read_text(encoding="utf-8"))
    return {
        "repository_url": cfg["repository"]["url"].rstrip("/"),
        "branch": cfg["repository"].get("branch", "main"),
        "site_url": cfg["html"]["baseurl"].rstrip("/") + "/",
    }


def launch_urls(repository_url: str, docname: str) -> dict[str, str]:
    """Colab and Binder links that open the reader's copy of ``docname`` (e.g. ``"book/ch01_fedavg"``)."""
    org_repo = re.sub(r"^https://github\.com/", "", repository_url.rstrip("/"))
    return {
        "Colab": f"https://colab.research.google.com/github/{org_repo}/blob/{READERS_BRANCH}/{docname}.ipynb",
        "Binder": f"https://mybinder.org/v2/gh/{org_repo}/{READERS_BRANCH}?urlpath=lab/tree/{docname}.ipynb",
    }


# --------------------------------------------------------------------------- #
# references


@dataclass
class References:
    """What a reader's copy links to.

    Attributes:
        site_url: the rendered book, ending in ``/``.
        targets: label -> (docname, anchor, link text), e.g.
            ``{"fig-x": ("book/ch01_fedavg", "fig-x", "Fig. 1.2")}``.
        docs: docname -> title.
        citations: bibliography key -> (authors, year), e.g. ``("McMahan et al.", "2017")``.
        glue: glue key -> text (the value the published build computed).
    """

    site_url: str
    targets: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    docs: dict[str, str] = field(default_factory=dict)
    citations: dict[str, tuple[str, str]] = field(default_factory=dict)
    glue: dict[str, str] = field(default_factory=dict)

    def url(self, docname: str, anchor: str = "") -> str:
        return f"{self.site_url}{docname}.html" + (f"#{anchor}" if anchor else "")


def citations_from_bib(path: Path) -> dict[str, tuple[str, str]]:
    """key -> (``"Surname"``, ``"Surname and Other"`` or ``"Surname et al."``, year) from a BibTeX file."""
    from pybtex.database import parse_file

    out = {}
    for key, entry in parse_file(str(path)).entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [" ".join(p.last_names).replace("{", "").replace("}", "") for p in people]
        if len(names) > 2:
            who = f"{names[0]} et al."
        else:
            who = " and ".join(names) or key
        out[key] = (who, entry.fields.get("year", "n.d."))
    return out


def sphinx_references(app, site_url: str) -> References:
    """The numbers, anchors and titles Sphinx resolved for this build (after the HTML is written)."""
    env = app.env
    fmt = {k: v[0].upper() + v[1:] for k, v in app.config.numfig_format.items()}
    refs = References(site_url=site_url, docs={d: t.astext() for d, t in env.titles.items()})
    for label, (docname, anchor, title) in env.domaindata["std"]["labels"].items():
        refs.targets[label] = (docname, anchor, title)
    for docname, kinds in env.toc_fignumbers.items():
        for kind, numbers in kinds.items():
            for anchor, number in numbers.items():
                text = ".".join(map(str, number))
                if kind == "displaymath":
                    refs.targets[anchor.removeprefix("equation-")] = (docname, anchor, f"({text})")
                else:
                    refs.targets[anchor] = (docname, anchor, fmt.get(kind, kind.capitalize() + " %s") % text)
    for bib in app.config.bibtex_bibfiles:
        refs.citations.update(citations_from_bib(Path(app.srcdir) / bib))
    return refs


def _plain(output: dict) -> str | None:
    """The plain-text form of one glue output (``text/plain``, with or without papermill's prefix)."""
    data = output.get("data", {})
    for mime in ("text/plain", "application/papermill.record/text/plain"):
        if mime in data:
            text = data[mime]
            return "".join(text) if isinstance(text, list) else str(text)
    return None


def glue_values(executed_nb: dict) -> dict[str, str]:
    """myst-nb ``glue`` values (their plain-text form) kept in an executed notebook's outputs.

    myst-nb 0.x kept them there; myst-nb 1.x removes them from the notebook and writes them beside
    it (:func:`glue_file_values`).
    """
    out = {}
    for cell in executed_nb.get("cells", []):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = _plain(output) if name else None
            if text is not None:
                out[name] = text
    return out


def glue_file_values(glue_json: dict) -> dict[str, str]:
    """myst-nb 1.x ``glue`` values (plain-text form) from ``jupyter_execute/<doc>.glue.json``.

    That file maps each key to the output the ``glue`` call displayed, e.g.
    ``{"ch01-iid-mean": {"output_type": "display_data", "data": {"text/plain": "0.895"}, ...}}``.
    """
    out = {}
    for name, output in glue_json.items():
        text = _plain(output) if isinstance(output, dict) else None
        if text is not None:
            out[name] = text
    return out


def executed_glue(executed: Path, docname: str) -> dict[str, str]:
    """Every glue value of one executed chapter, from whichever place this myst-nb keeps them.

    Args:
        executed: the folder of the executed notebooks (``_build/jupyter_execute``).
        docname: the chapter, e.g. ``"book/ch01_fedavg"``.

    Returns:
        key -> plain text; empty when the chapter was not executed there.
    """
    values = {}
    ran, side = Path(executed) / f"{docname}.ipynb", Path(executed) / f"{docname}.glue.json"
    if ran.is_file():
        values.update(glue_values(json.loads(ran.read_text(encoding="utf-8"))))
    if side.is_file():
        values.update(glue_file_values(json.loads(side.read_text(encoding="utf-8"))))
    return values


# --------------------------------------------------------------------------- #
# Markdown conversion

ROLE = re.compile(r"\{([A-Za-z][\w:.-]*)\}`([^`]*)`")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})[ \t]*\{(?P<name>[\w:.-]+)\}[ \t]*(?P<arg>.*)$")
TARGET = re.compile(r"^[ \t]*\((?P<label>[^()\s]+)\)=[ \t]*$")
LABELLED_MATH_END = re.compile(r"^(?P<head>.*)\$\$[ \t]*\((?P<label>[^()\s]+)\)[ \t]*$")
EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
ADMONITIONS = {
    "note",
    "tip",
    "hint",
    "important",
    "warning",
    "caution",
    "attention",
    "danger",
    "error",
    "seealso",
    "admonition",
}


class Converter:
    """Turns the MyST Markdown of one chapter (``docname``) into plain Markdown."""

    def __init__(self, refs: References, docname: str):
        self.refs = refs
        self.docname = docname
        self.missing_glue: list[str] = []  # glue keys the references hold no value for

    # -- roles -------------------------------------------------------------
    def _link(self, label: str, text: str | None = None) -> str:
        target = self.refs.targets.get(label)
        if target is None:
            return text or label
        docname, anchor, default = target
        return f"[{text or default}]({self.refs.url(docname, anchor)})"

    def _cite(self, keys: str, textual: bool) -> str:
        parts = []
        for key in (k.strip() for k in keys.split(",") if k.strip()):
            who, year = self.refs.citations.get(key, (key, ""))
            parts.append(f"{who} ({year})" if textual else f"{who}, {year}")
        bib = self.refs.url("book/bibliography")
        return f"[{'; '.join(parts)}]({bib})" if textual else f"([{'; '.join(parts)}]({bib}))"

    def _role(self, match: re.Match) -> str:
        name, content = match.group(1), match.group(2)
        explicit = EXPLICIT.match(content)
        text, target = (explicit.group("text"), explicit.group("target")) if explicit else (None, content)
        if name in ("numref", "ref", "prf:ref", "eq", "numref:figure"):
            if text and "%s" in text:
                number = self.refs.targets.get(target, ("", "", ""))[2].split(" ")[-1]
                text = text.replace("%s", number)
            return self._link(target, text)
        if name == "doc":
            doc = target if target.startswith("/") else str(Path(self.docname).parent / target)
            doc = doc.lstrip("/").removesuffix(".md").removesuffix(".ipynb")
            return f"[{text or self.refs.docs.get(doc, doc)}]({self.refs.url(doc)})"
        if name in ("cite", "cite:p", "cite:ps", "cite:t", "cite:ts"):
            return self._cite(content, textual=name.startswith("cite:t"))
        if name == "math":
            return f"${content}$"
        if name.startswith("glue"):
            key, _, spec = content.partition(":")
            value = self.refs.glue.get(key.strip())
            if value is None:
                self.missing_glue.append(key.strip())
                return f"`{key.strip()}`"
            if spec:
                try:
                    return format(float(value.strip("'\"")), spec)
                except ValueError:
                    pass
            return value.strip("'\"")
        if name in ("sub", "subscript"):
            return f"<sub>{content}</sub>"
        if name in ("sup", "superscript"):
            return f"<sup>{content}</sup>"
        if name == "abbr":
            return text or content
        return f"`{text or target}`"  # any other role: its text as code

    def roles(self, text: str) -> str:
        return ROLE.sub(self._role, text)

    # -- blocks ------------------------------------------------------------
    def _number(self, label: str | None, default: str) -> str:
        return self.refs.targets.get(label, ("", "", default))[2] if label else default

    def _directive(self, name: str, arg: str, options: dict[str, str], body: str) -> str:
        label = options.get("label") or options.get("name")
        anchor = f'<a id="{label}"></a>\n\n' if label else ""
        if name in ("math",):
            tag = f" \\tag{{{self._number(label, '')[1:-1]}}}" if label and label in self.refs.targets else ""
            return f"$$\n{body.strip()}{tag}\n$$"
        if name == "solution":
            exercise = self._number(arg.strip(), "the exercise") if arg.strip() else "the exercise"
            return details(f"Solution to {exercise}", self.convert(body))
        if name == "exercise":
            number = self._number(label, "Exercise")
            title = f" ({self.roles(arg.strip())})" if arg.strip() else ""
            return f"{anchor}**{number}{title}.**\n\n{self.convert(body)}"
        if name.startswith("prf:"):
            kind = name[4:]
            if kind == "proof":
                return f"*Proof.* {self.convert(body).strip()} $\\blacksquare$"
            number = self._number(label, kind.capitalize())
            title = f" ({self.roles(arg.strip())})" if arg.strip() else ""
            return f"{anchor}**{number}{title}.**\n\n{self.convert(body)}"
        if name in ADMONITIONS:
            title = self.roles(arg.strip()) or name.capitalize()
            if "dropdown" in options.get("class", ""):
                return details(title, self.convert(body))
            return quote(f"**{title}**\n\n{self.convert(body)}")
        if name in ("figure", "image"):
            src = arg.strip()
            if not re.match(r"^[a-z]+://", src):
                src = self.refs.site_url + str(Path(self.docname).parent / src)
            caption = self.convert(body).strip()
            return f"{anchor}![{caption or label or ''}]({src})" + (f"\n\n*{caption}*" if caption else "")
        if name in ("toctree", "bibliography", "glue:figure", "glue:any", "glue:math", "raw", "eval-rst"):
            return ""
        if name in ("code-block", "code", "sourcecode"):
            return f"```{arg.strip()}\n{body}\n```"
        title = f"**{self.roles(arg.strip())}**\n\n" if arg.strip() else ""
        return title + self.convert(body)

    def convert(self, text: str) -> str:
        """Plain Markdown for a block of MyST Markdown."""
        lines = text.split("\n")
        out: list[str] = []
        i = 0
        in_code = None  # the fence of an ordinary code block we are inside
        while i < len(lines):
            line = lines[i]
            if in_code:
                out.append(line)
                if line.strip().startswith(in_code) and set(line.strip()) == {in_code[0]}:
                    in_code = None
                i += 1
                continue
            m = FENCE.match(line)
            if m:
                fence = m.group("fence")
                j = i + 1
                while j < len(lines):
                    stripped = lines[j].strip()
                    if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                        break
                    j += 1
                body_lines = lines[i + 1 : j]
                options, body_lines = _options(body_lines)
                block = self._directive(m.group("name"), m.group("arg"), options, "\n".join(body_lines))
                out.extend(block.split("\n"))
                i = j + 1
                continue
            plain_fence = re.match(r"^[ \t]*(`{3,}|~{3,})", line)
            if plain_fence:
                in_code = plain_fence.group(1)
                out.append(line)
                i += 1
                continue
            if TARGET.match(line) or line.lstrip().startswith("% ") or line.strip() in ("%", "+++"):
                i += 1
                continue
            m = LABELLED_MATH_END.match(line)
            if m:
                label = m.group("label")
                number = self.refs.targets.get(label, ("", "", ""))[2].strip("()")
                tag = f" \\tag{{{number}}}" if number else ""
                out.append(f"{m.group('head')}{tag}$$" if m.group("head").strip() else f"{tag.strip()}\n$$".lstrip())
                i += 1
                continue
            out.append(self.roles(line))
            i += 1
        return "\n".join(out)


def _options(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split a directive's ``:key: value`` lines (or a ``---`` YAML block) from its body."""
    options: dict[str, str] = {}
    if lines and lines[0].strip() == "---":
        end = next((k for k in range(1, len(lines)) if lines[k].strip() == "---"), None)
        if end is not None:
            for opt in lines[1:end]:
                key, _, value = opt.partition(":")
                options[key.strip()] = value.strip()
            return options, lines[end + 1 :]
    k = 0
    while k < len(lines):
        m = re.match(r"^[ \t]*:([\w-]+):[ \t]*(.*)$", lines[k])
        if not m:
            break
        options[m.group(1)] = m.group(2).strip()
        k += 1
    return options, lines[k:]


def details(summary: str, body: str) -> str:
    """A collapsed HTML ``<details>`` block (closed until the reader opens it)."""
    return f"<details>\n<summary>{summary}</summary>\n\n{body.strip()}\n\n</details>"


def quote(text: str) -> str:
    return "\n".join(f"> {line}".rstrip() for line in text.strip().split("\n"))


# --------------------------------------------------------------------------- #
# notebooks

# where a solution starts and ends: read by the package, which grades coursework from the same marks
# (the checkout's own package, also where this runs as a script or another version is installed)
_CHECKOUT = Path(__file__).resolve().parents[2]
if (_CHECKOUT / "fedlearn_edu" / "coursework").is_dir() and "fedlearn_edu" not in sys.modules:
    sys.path.insert(0, str(_CHECKOUT))
from fedlearn_edu.coursework.notebook import (  # noqa: E402
    SOLUTION_END,  # noqa: F401
    SOLUTION_START,  # noqa: F401
    split_solutions,
)
from fedlearn_edu.coursework.notebook import cell_source as _source  # noqa: E402

SOLUTION_HEADER = """\
# @title {title} (hidden: open it to see the code)
from fedlearn_edu.exercises import collapsed_output

with collapsed_output("Output of the {output}"):
"""
INDENT = "    "


def _string_continuations(code: str) -> set[int]:
    """0-based numbers of the lines that continue a multi-line string (indenting them would change it)."""
    import io
    import tokenize

    lines: set[int] = set()
    strings = (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in strings and tok.end[0] > tok.start[0]:
                lines.update(range(tok.start[0], tok.end[0]))  # rows are 1-based: these are the 0-based next lines
    except (tokenize.TokenError, SyntaxError):  # not plain Python (IPython syntax): indent every line
        pass
    return lines


def solution_cell(code: str, title: str) -> str:
    """A solution's code as the reader's copy runs it: under a Colab form title, output collapsed.

    The code runs inside :func:`fedlearn_edu.exercises.collapsed_output`, so what it prints or draws
    stays in a closed ``<details>`` block (JupyterLab shows a hidden cell's outputs again once it runs,
    Colab never hides them). :func:`solution_code` gives the code back.

    Args:
        code: the solution cell's source.
        title: e.g. ``"Solution to Exercise 4.2"``.

    Returns:
        The new source.
    """
    keep = _string_continuations(code)
    lines = code.split("\n")
    body = "\n".join(line if i in keep else INDENT + line for i, line in enumerate(lines))
    output = title[0].lower() + title[1:]
    return SOLUTION_HEADER.format(title=title, output=output) + (body if body.strip() else INDENT + "pass")


def solution_code(source: str) -> str:
    """The code of a solution cell written by :func:`solution_cell` (inverse of it)."""
    header = SOLUTION_HEADER.count("\n")
    code = "\n".join(source.split("\n")[header:])
    keep = _string_continuations(code)
    return "\n".join(line if i in keep else line.removeprefix(INDENT) for i, line in enumerate(code.split("\n")))


def _hide(cell: dict, title: str) -> None:
    """Collapse a solution's code cell: source hidden (JupyterLab; Colab's form view), output collapsed."""
    meta = cell.setdefault("metadata", {})
    meta["jupyter"] = {"source_hidden": True, "outputs_hidden": True}
    meta["cellView"] = "form"
    meta.setdefault("tags", [])
    if "solution" not in meta["tags"]:
        meta["tags"].append("solution")
    cell["source"] = solution_cell(_source(cell), title)


PLUMBING_TITLE = "# @title The numbers the text quotes, and the checks that guard it"


def _collapse_plumbing(cell: dict) -> None:
    """Collapse a cell the rendered page hides (``remove-input``: glue calls, checks of the prose).

    The reader's copy keeps it, since it computes the numbers the text quotes, with its source
    hidden (JupyterLab's ``jupyter.source_hidden``; Colab's form view under a ``# @title`` line).
    """
    meta = cell.setdefault("metadata", {})
    meta["jupyter"] = {**meta.get("jupyter", {}), "source_hidden": True}
    meta["cellView"] = "form"
    source = _source(cell)
    if not source.startswith("# @title"):
        cell["source"] = f"{PLUMBING_TITLE}\n{source}"


def reader_copy(
    nb: dict, refs: References, docname: str, strict_glue: bool = False, install: str | None = None
) -> dict:
    """The reader's copy of one chapter notebook (a new dict; ``nb`` is left as it is).

    Args:
        nb: the chapter, as ``json.load`` reads an ``.ipynb``.
        refs: what the copy links to (:func:`sphinx_references`).
        docname: the chapter's document name, e.g. ``"book/ch01_fedavg"``.
        strict_glue: refuse a ``{glue}`` role whose key ``refs.glue`` has no value for
            (otherwise the key is written, as code).
        install: the source of the copy's first code cell (the install cell pinned to the
            commit that built the copy, :func:`install_cell`); ``None`` keeps the chapter's.

    Returns:
        The converted notebook, without outputs.

    Raises:
        ValueError: ``strict_glue`` and some glue keys have no value (they are named).
    """
    conv = Converter(refs, docname)
    out = copy.deepcopy(nb)
    cells = []
    solution_of = None  # inside solution-start ... solution-end: the exercise's text
    label = None  # ... and its label
    first_code = True
    for cell in out["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            if first_code and install is not None:
                cell["source"] = install.splitlines(keepends=True)
            first_code = False
            if solution_of:
                _hide(cell, f"Solution to {solution_of}")
            elif "remove-input" in cell.get("metadata", {}).get("tags", []):
                _collapse_plumbing(cell)
            cells.append(cell)
            continue
        if cell["cell_type"] != "markdown":
            cells.append(cell)
            continue
        pieces, label = split_solutions(_source(cell), label)
        solution_of = None if label is None else (conv._number(label, "the exercise") if label else "the exercise")
        pieces = [
            (piece, None if inside is None else (conv._number(inside, "the exercise") if inside else "the exercise"))
            for piece, inside in pieces
        ]
        parts = []
        for piece, inside in pieces:
            md = conv.convert(piece).strip()
            if md:
                parts.append(details(f"Solution to {inside}", md) if inside else md)
        if parts:
            cell["source"] = "\n\n".join(parts)
            cells.append(cell)
    out["cells"] = cells
    out.setdefault("metadata", {})["fedlearn_reader_copy"] = {"source": f"{docname}.ipynb"}
    if strict_glue and conv.missing_glue:
        missing = ", ".join(dict.fromkeys(conv.missing_glue))
        raise ValueError(
            f"The reader's copy of {docname} would show glue keys instead of numbers: no value for {missing}. "
            "Was the chapter executed, and does it glue these keys?"
        )
    return out


def write_reader_copies(
    chapters: dict[str, Path], refs: References, dest: Path, executed: Path | None = None, install: str | None = None
) -> list[Path]:
    """Write the reader's copy of every chapter under ``dest`` (``dest/<docname>.ipynb``).

    Args:
        chapters: docname -> source notebook.
        refs: the resolved references; its ``glue`` values are filled per chapter from ``executed``.
        dest: output folder.
        executed: folder of the executed notebooks (``_build/jupyter_execute``), for glue values
            (:func:`executed_glue`); then a glued key without a value is an error, not a key in the copy.
        install: every copy's first code cell (:func:`reader_copy`).

    Returns:
        The paths written.

    Raises:
        ValueError: a chapter glues a key the executed chapter holds no value for.
    """
    written = []
    for docname, path in sorted(chapters.items()):
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        refs.glue = executed_glue(executed, docname) if executed else {}
        target = Path(dest) / f"{docname}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_ = reader_copy(nb, refs, docname, strict_glue=executed is not None, install=install)
        target.write_text(json.dumps(copy_, indent=1, ensure_ascii=False) + "\n")
        written.append(target)
    return written


def sync_install_cells(root: Path) -> list[Path]:
    """Rewrite the first code cell of every chapter under ``root/book`` from ``_config.yml``."""
    cfg = book_config(root)
    cell_source = install_cell(cfg["repository_url"], cfg["branch"])
    changed = []
    for path in sorted((Path(root) / "book").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        first = next(c for c in nb["cells"] if c["cell_type"] == "code")
        if _source(first) != cell_source:
            first["source"] = cell_source.splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--sync-install-cells"]:
        sys.exit("usage: python book/_ext/reader_copies.py --sync-install-cells")
    for p in sync_install_cells(Path(__file__).resolve().parents[2]):
        print(f"rewrote the install cell of {p}")

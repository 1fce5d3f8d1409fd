"""Reader's copies of the chapters (``book/_ext/reader_copies.py``).

* The conversion, on MyST written here: roles, labels, theorem-like blocks, solutions.
* Every chapter's install cell is the one ``_config.yml`` gives, and keeps figures inline under
  ``MPLBACKEND=Agg``.
* Glue values are read from wherever myst-nb keeps them (the executed notebook's outputs in 0.x,
  ``<doc>.glue.json`` beside it in 1.x), and a glued key without a value stops the build.
* The copies the book build writes: one per chapter, no raw MyST role or directive left (parsed with
  myst-parser's own Markdown parser), every glued number in place of its key, no solution outside a
  collapsed ``<details>`` or a hidden cell, and each runs top to bottom: under nbval where its
  chapter asked the build for a data set it lacked, else as the build executed the same code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "book" / "_ext"))
import fedlearn_book  # noqa: E402
import reader_copies as rc  # noqa: E402

CHAPTERS = sorted((REPO / "book").glob("*.ipynb"))  # every notebook page: the chapters and the closing page
SITE = "https://example.org/book/"
RAW_TOKENS = {
    "myst_role",
    "myst_target",
    "math_block_label",
    "myst_line_comment",
    "myst_block_break",
    "substitution_inline",
    "substitution_block",
}


def _md_parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    extensions = {"amsmath", "colon_fence", "deflist", "dollarmath", "substitution"}
    return create_md_parser(MdParserConfig(enable_extensions=extensions), RendererHTML)


def raw_myst(markdown: str) -> list[str]:
    """The MyST constructs (roles, labels, directives...) that a MyST parser finds in ``markdown``."""

    def walk(tokens):
        for t in tokens:
            yield t
            yield from walk(t.children or [])

    found = []
    for t in walk(_md_parser().parse(markdown)):
        if t.type in RAW_TOKENS or (t.type in ("fence", "colon_fence") and t.info.strip().startswith("{")):
            found.append(f"{t.type} {t.info or t.content!r}"[:120])
    return found


def _refs() -> rc.References:
    return rc.References(
        site_url=SITE,
        targets={
            "fig-a": ("book/ch09", "fig-a", "Fig. 9.1"),
            "eq-a": ("book/ch09", "equation-eq-a", "(9.2)"),
            "thm-a": ("book/ch09", "thm-a", "Theorem 9.1"),
            "ex-a": ("book/ch09", "ex-a", "Exercise 9.3"),
            "sec-a": ("book/ch09", "sec-a", "A section"),
        },
        docs={"book/ch08": "Chapter eight"},
        citations={"k1": ("McMahan et al.", "2017"), "k2": ("Li and Smith", "2020")},
        glue={"acc": "0.8123"},
    )


MYST = """\
(sec-a)=
## Title

See {numref}`fig-a`, {eq}`eq-a`, {prf:ref}`thm-a`, {ref}`sec-a`, {ref}`here <sec-a>` and {doc}`ch08`.
As {cite:t}`k1` showed {cite}`k1,k2`; accuracy {glue:text}`acc:.1%`.
% a comment

$$
x = 1
$$ (eq-a)

```{prf:theorem} Big
:label: thm-a

Body with {math}`x^2`.
```

```{prf:proof}
Easy.
```

::::{exercise} Try
:label: ex-a

Do it.
::::

:::{solution} ex-a
The answer is 42.

```python
print(42)
```
:::

```{note}
Careful.
```

```python
x = {"a": 1}  # {eq}`not-a-role` inside code stays
```
"""


def test_conversion_leaves_no_myst_and_links_to_the_site():
    assert raw_myst(MYST), "the sample must contain MyST for the check to mean anything"
    out = rc.Converter(_refs(), "book/ch09").convert(MYST)
    assert raw_myst(out) == [], raw_myst(out)
    for expected in (
        f"[Fig. 9.1]({SITE}book/ch09.html#fig-a)",
        f"[(9.2)]({SITE}book/ch09.html#equation-eq-a)",
        f"[Theorem 9.1]({SITE}book/ch09.html#thm-a)",
        f"[A section]({SITE}book/ch09.html#sec-a)",
        f"[here]({SITE}book/ch09.html#sec-a)",
        f"[Chapter eight]({SITE}book/ch08.html)",
        f"[McMahan et al. (2017)]({SITE}book/bibliography.html)",
        "McMahan et al., 2017; Li and Smith, 2020",
        "accuracy 81.2%",
        "\\tag{9.2}",
        "**Theorem 9.1 (Big).**",
        "**Exercise 9.3 (Try).**",
        "*Proof.* Easy.",
        "> **Note**",
    ):
        assert expected in out, f"{expected!r} not in:\n{out}"
    assert "a comment" not in out
    # the solution, code included, is inside a closed <details> block
    sol = out.index("<details>")
    assert out.index("The answer is 42.") > sol and out.index("print(42)") > sol
    assert out.index("</details>") > out.index("print(42)")
    assert "<details open" not in out
    assert "{eq}`not-a-role` inside code stays" in out


def _nb(*cells):
    return {
        "cells": [
            {
                "cell_type": t,
                "metadata": {},
                "source": s,
                **({"outputs": [], "execution_count": None} if t == "code" else {}),
            }
            for t, s in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_solution_code_cells_are_collapsed_and_the_input_is_not_modified():
    nb = _nb(
        ("code", "import x"),
        ("markdown", "```{exercise}\n:label: ex-a\nQ?\n```\n\n````{solution-start} ex-a\n````\nText of the solution."),
        ("code", "answer = 42"),
        ("markdown", "```{solution-end}\n```\nAfter."),
        ("code", "after = 1"),
    )
    before = json.dumps(nb)
    out = rc.reader_copy(nb, _refs(), "book/ch09")
    assert json.dumps(nb) == before, "the source notebook must not be modified"
    sol_md = out["cells"][1]["source"]
    assert "<details>\n<summary>Solution to Exercise 9.3</summary>" in sol_md and "Text of the solution." in sol_md
    assert sol_md.index("Text of the solution.") > sol_md.index("<details>")
    hidden = out["cells"][2]
    assert hidden["metadata"]["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert hidden["metadata"]["cellView"] == "form" and "answer = 42" in hidden["source"]
    assert out["cells"][3]["source"] == "After."
    assert "jupyter" not in out["cells"][4]["metadata"] and "jupyter" not in out["cells"][0]["metadata"]


def test_cells_the_page_hides_are_kept_collapsed_in_the_reader_copy():
    nb = _nb(("code", "import x"), ("code", "y = 1"), ("code", 'glue("k", y, display=False)'))
    nb["cells"][2]["metadata"]["tags"] = ["remove-input"]
    before = json.dumps(nb)
    out = rc.reader_copy(nb, _refs(), "book/ch09")
    assert json.dumps(nb) == before, "the source notebook must not be modified"
    glued = out["cells"][2]
    assert glued["metadata"]["jupyter"] == {"source_hidden": True} and glued["metadata"]["cellView"] == "form"
    assert glued["source"] == rc.PLUMBING_TITLE + '\nglue("k", y, display=False)'  # Colab's form view: a title
    assert "jupyter" not in out["cells"][1]["metadata"]


def test_no_chapter_shows_a_glue_call_or_a_check_of_its_prose():
    """The rendered pages show the code a reader learns from; the glue calls live in cells they hide (or in a
    solution's code, which stays closed in its drop-down: a solution is one cell, its output one block)."""
    shown = {}
    for path in CHAPTERS:
        inside = False  # between solution-start and solution-end
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            tags = cell.get("metadata", {}).get("tags", [])
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                start, end = source.rfind("solution-start"), source.rfind("solution-end")
                inside = start > end if start >= 0 or end >= 0 else inside
            elif not inside and "remove-input" not in tags:
                n = sum(line.lstrip().startswith("glue(") for line in source.splitlines())
                if n:
                    shown[path.stem] = shown.get(path.stem, 0) + n
    assert not shown, f"glue(...) lines on the rendered pages: {shown}"


SOLUTION_CODE = '''\
text = """a multi-line
  string, kept as it is"""
for i in range(2):
    print(f"secret {i}", text)

import matplotlib.pyplot as plt
plt.plot([0, 1])
plt.show()
'''


def test_solution_cell_gives_the_code_back():
    source = rc.solution_cell(SOLUTION_CODE, "Solution to Exercise 9.3")
    assert source.startswith("# @title Solution to Exercise 9.3")
    assert rc.solution_code(source) == SOLUTION_CODE
    assert 'text = """a multi-line\n  string, kept as it is"""' in source


def test_solution_cell_output_is_collapsed(tmp_path):
    """Run in a kernel (MPLBACKEND=Agg, after the install cell): one closed <details> holds the text and figure."""
    outputs = _run_after_install_cell(rc.solution_cell(SOLUTION_CODE, "Solution to Exercise 9.3"), tmp_path)
    assert [o["output_type"] for o in outputs] == ["display_data"], outputs
    shown = outputs[0]["data"]["text/html"]
    assert shown.startswith("<details><summary>Output of the solution to Exercise 9.3</summary>")
    assert "<details open" not in shown and shown.endswith("</details>")
    assert "secret 0 a multi-line\n  string, kept as it is\nsecret 1" in shown
    assert '<img src="data:image/png;base64,' in shown


def _run_after_install_cell(code: str, tmp_path: Path) -> list:
    """The outputs of ``code`` run in a kernel after the install cell, with MPLBACKEND=Agg exported.

    The kernel runs in a folder beside a decoy ``fedlearn_edu`` (the checkout is on PYTHONPATH).
    """
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    cfg = rc.book_config(REPO)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(rc.install_cell(cfg["repository_url"])), nbformat.v4.new_code_cell(code)]

    (tmp_path / "fedlearn_edu").mkdir()  # the install cell's source-checkout branch must not be taken
    work = tmp_path / "book"
    work.mkdir()
    saved = dict(os.environ)
    os.environ.update(MPLBACKEND="Agg", PYTHONPATH=str(REPO))
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb.cells[1].outputs


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_install_cell_is_the_one_config_gives(path):
    cfg = rc.book_config(REPO)
    nb = json.loads(path.read_text(encoding="utf-8"))
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert rc._source(first) == rc.install_cell(cfg["repository_url"], cfg["branch"]), (
        f"{path.name}: the first code cell differs from the install cell of _config.yml; run\n"
        "    python book/_ext/reader_copies.py --sync-install-cells"
    )


SHA = "0123456789abcdef0123456789abcdef01234567"


def test_install_cell_installs_the_repository_never_the_bare_index_name():
    """The index name is not registered: whoever took it would run their code on every reader."""
    repo = rc.book_config(REPO)["repository_url"]
    cell = rc.install_cell(repo, SHA)
    assert f'SOURCE = "fedlearn-edu @ git+{repo}@{SHA}"' in cell
    sources = re.findall(r"pip\", \"install\", \"-q\", (\w+)\]", cell)
    assert sources == ["SOURCE"], sources  # one pip install, of SOURCE
    assert '"fedlearn-edu"' not in cell and "pip install fedlearn-edu" not in cell


def test_reader_copy_installs_the_commit_that_built_it():
    repo = rc.book_config(REPO)["repository_url"]
    chapter = json.loads(CHAPTERS[0].read_text(encoding="utf-8"))
    copy = rc.reader_copy(chapter, _refs(), "book/ch", install=rc.install_cell(repo, SHA))
    kept = rc.reader_copy(chapter, _refs(), "book/ch")  # without install=: the chapter's own cell
    code, kept_code = ([rc._source(c) for c in nb["cells"] if c["cell_type"] == "code"] for nb in (copy, kept))
    assert code[0] == rc.install_cell(repo, SHA) and kept_code[0] == rc.install_cell(repo, "main")
    assert code[1:] == kept_code[1:] and len(code) > 1  # only the install cell differs


def test_binder_installs_the_commit_that_built_the_copies():
    lines = rc.binder_requirements("https://github.com/org/repo/", SHA).splitlines()
    assert f"fedlearn-edu @ git+https://github.com/org/repo@{SHA}" in lines
    assert not [ln for ln in lines if ln.split("#")[0].strip() in ("fedlearn-edu", "fedlearn_edu")]


def test_the_build_commit_comes_from_the_workflow_else_from_git(tmp_path):
    other = "f" * 40
    env = {"FEDLEARN_BUILD_COMMIT": SHA, "GITHUB_SHA": other}
    assert rc.build_commit(tmp_path, env) == SHA
    assert rc.build_commit(tmp_path, {"GITHUB_SHA": other}) == other
    with pytest.raises(ValueError, match="FEDLEARN_BUILD_COMMIT='main' is not a full 40-digit commit hash"):
        rc.build_commit(tmp_path, {"FEDLEARN_BUILD_COMMIT": "main"})
    plain = tmp_path / "plain"  # no git checkout, no variable: the branch, said so in the readers' README
    plain.mkdir()
    assert rc.build_commit(plain, {}) is None and rc.build_ref(plain, "main", {}) == "main"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=checkout, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    assert rc.build_ref(checkout, "main", {}) == head


def test_install_cell_offline_stops_with_what_to_do(tmp_path):
    """Where pip cannot fetch the source (offline: here a git that always fails), the cell stops with a clear error."""
    repo = rc.book_config(REPO)["repository_url"]
    cell = rc.install_cell(repo, SHA).replace("%matplotlib inline", "")
    (tmp_path / "cell.py").write_text(cell, encoding="utf-8")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text("#!/bin/sh\necho 'fatal: unable to access GitHub (offline)' >&2\nexit 128\n")
    (fake / "git").chmod(0o755)
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    # -S: no site-packages, so fedlearn_edu is not importable (pip, a subprocess, still runs)
    proc = subprocess.run(
        [sys.executable, "-S", "cell.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"pip install 'fedlearn-edu @ git+{repo}@{SHA}' ..." in proc.stdout
    err = proc.stderr
    assert "RuntimeError: Could not install fedlearn_edu from GitHub; pip said:" in err
    assert "check the internet connection" in err and f"pip install 'fedlearn-edu @ git+{repo}@{SHA}'" in err


def test_repository_url_is_written_only_in_config():
    url = rc.book_config(REPO)["repository_url"]
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    # the chapters' install cells are generated from _config.yml (test above); README is read on GitHub;
    # CITATION.cff is read by GitHub and citation managers (tests/test_packaging.py checks it against _config.yml)
    allowed = {"_config.yml", "README.md", "CITATION.cff", *(str(p.relative_to(REPO)) for p in CHAPTERS)}
    hits = [
        f
        for f in tracked.stdout.split()
        if f not in allowed and (REPO / f).is_file() and url in (REPO / f).read_text(encoding="utf-8", errors="ignore")
    ]
    assert not hits, f"the repository URL is written in {hits}; derive it from _config.yml instead"


def test_readme_opens_the_reader_copies():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for url in rc.launch_urls(rc.book_config(REPO)["repository_url"], "book/ch01_fedavg").values():
        assert url in readme, url


def test_install_cell_keeps_figures_inline_under_agg(tmp_path):
    """The set-up cell, then a figure, executed with MPLBACKEND=Agg exported: the figure is shown."""
    outputs = _run_after_install_cell("import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()", tmp_path)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"no figure shown under MPLBACKEND=Agg: {outputs}"


def _chapter(markdown: str) -> dict:
    return {
        "cells": [{"cell_type": "markdown", "metadata": {}, "source": markdown}],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.mark.parametrize("layout", ["glue.json", "outputs"])
def test_glue_values_come_from_where_myst_nb_keeps_them(tmp_path, layout):
    executed = tmp_path / "jupyter_execute"
    (executed / "book").mkdir(parents=True)
    output = {
        "output_type": "display_data",
        "metadata": {"scrapbook": {"name": "acc", "mime_prefix": "application/papermill.record/"}},
        "data": {"text/plain": "0.8123"},
    }
    word = dict(output, metadata={"scrapbook": {"name": "word"}}, data={"text/plain": "'better'"})
    ran = _chapter("")
    if layout == "glue.json":  # myst-nb 1.x: the notebook keeps no glue output, the values sit beside it
        (executed / "book" / "ch.glue.json").write_text(json.dumps({"acc": output, "word": word}))
    else:  # myst-nb 0.x: the outputs stay in the executed notebook, under papermill's mime prefix
        prefixed = [
            dict(o, data={"application/papermill.record/text/plain": o["data"]["text/plain"]}) for o in (output, word)
        ]
        ran["cells"].append({"cell_type": "code", "metadata": {}, "source": "", "outputs": prefixed})
    (executed / "book" / "ch.ipynb").write_text(json.dumps(ran))
    source = tmp_path / "ch.ipynb"
    source.write_text(json.dumps(_chapter("accuracy {glue:text}`acc:.1%`, {glue:text}`word` than FedAvg")))
    written = rc.write_reader_copies({"book/ch": source}, _refs(), tmp_path / "out", executed=executed)
    text = rc._source(json.loads(written[0].read_text())["cells"][0])
    assert text == "accuracy 81.2%, better than FedAvg"


def test_a_glued_key_without_a_value_stops_the_copies(tmp_path):
    executed = tmp_path / "jupyter_execute"
    (executed / "book").mkdir(parents=True)
    (executed / "book" / "ch.glue.json").write_text("{}")
    source = tmp_path / "ch.ipynb"
    source.write_text(json.dumps(_chapter("mean {glue:text}`ch-mean:.2f` and {glue:text}`ch-n`")))
    with pytest.raises(ValueError, match="book/ch would show glue keys instead of numbers: no value for ch-mean, ch-n"):
        rc.write_reader_copies({"book/ch": source}, _refs(), tmp_path / "out", executed=executed)
    # without executed chapters (a conversion alone) the key is written as code, as before
    out = rc.write_reader_copies({"book/ch": source}, _refs(), tmp_path / "out")
    assert "`ch-mean`" in rc._source(json.loads(out[0].read_text())["cells"][0])


# --------------------------------------------------------------------------- #
# the copies the build wrote


@pytest.fixture(scope="module")
def copies(built_book: Path) -> dict[str, Path]:
    folder = built_book / rc.READERS_DIR / "book"
    return {p.name: p for p in sorted(folder.glob("*.ipynb"))}


def test_every_chapter_has_a_reader_copy(copies):
    assert sorted(copies) == [p.name for p in CHAPTERS]


@pytest.mark.parametrize("name", [p.name for p in CHAPTERS])
def test_reader_copy_has_no_raw_myst_and_no_visible_solution(copies, name):
    nb = json.loads(copies[name].read_text(encoding="utf-8"))
    source = json.loads((REPO / "book" / name).read_text(encoding="utf-8"))
    assert raw_myst("\n\n".join(rc._source(c) for c in source["cells"] if c["cell_type"] == "markdown"))
    for i, cell in enumerate(nb["cells"]):
        text = rc._source(cell)
        if cell["cell_type"] == "markdown":
            assert raw_myst(text) == [], f"{name} cell {i}: {raw_myst(text)}"
            # every solution sits inside a <details> block (closed: no `open` attribute)
            for pos in [j for j in range(len(text)) if text.startswith("Solution to", j)]:
                assert text.rfind("<summary>", 0, pos) > text.rfind("</details>", 0, pos), f"{name} cell {i}"
            assert "<details open" not in text
        elif "solution" in cell["metadata"].get("tags", []):
            assert cell["metadata"]["jupyter"] == {"source_hidden": True, "outputs_hidden": True}

    # the code is the chapter's own (solution cells: under Colab's form title, output collapsed; the cells
    # the page hides: under a title of their own, source collapsed)
    def own(cell):
        tags, text = cell["metadata"].get("tags", []), rc._source(cell)
        if "solution" in tags:
            return rc.solution_code(text)
        if "remove-input" in tags:
            assert cell["metadata"]["jupyter"]["source_hidden"] is True
            return text.removeprefix(rc.PLUMBING_TITLE + "\n")
        return text

    ours = [own(c) for c in nb["cells"] if c["cell_type"] == "code"]
    theirs = [rc._source(c) for c in source["cells"] if c["cell_type"] == "code"]
    assert ours == theirs


@pytest.mark.parametrize("name", [p.name for p in CHAPTERS])
def test_reader_copy_keeps_every_glued_number(copies, name):
    """Colab and Binder open the copies: each glued key of the chapter must read as its value."""
    source = json.loads((REPO / "book" / name).read_text(encoding="utf-8"))
    keys = {
        m.group(2).partition(":")[0].strip()
        for c in source["cells"]
        if c["cell_type"] == "markdown"
        for m in rc.ROLE.finditer(rc._source(c))
        if m.group(1).startswith("glue")
    }
    text = "\n".join(rc._source(c) for c in json.loads(copies[name].read_text(encoding="utf-8"))["cells"])
    assert "{glue" not in text
    left = sorted(k for k in keys if f"`{k}`" in text)
    assert left == [], f"{name}: {len(left)} glue keys instead of numbers, e.g. {left[:5]}"


def _requests(built_book: Path, name: str) -> list[dict]:
    """The data requests the build's execution of chapter ``name`` logged (``book/_ext/fedlearn_book.py``, 8.)."""
    path = fedlearn_book.requests_file(built_book, f"book/{Path(name).stem}")
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def missed_data(built_book: Path, name: str) -> list[str]:
    """The data sets chapter ``name`` asked for and the newcomer's build did not have (sorted, unique)."""
    return sorted({r["dataset"] for r in _requests(built_book, name) if not r["found"]})


def test_the_build_logged_every_chapter_that_falls_back_to_the_digits(built_book):
    """The log works: a chapter that calls ``dataset_or_digits`` asked the build for a data set it lacked
    (the newcomer's build has no MNIST); else no copy would be executed again and nothing would say so."""
    falls_back = [p.name for p in CHAPTERS if "dataset_or_digits(" in p.read_text(encoding="utf-8")]
    assert falls_back, "no chapter falls back to the digits: this test checks nothing any more"
    assert [n for n in falls_back if not missed_data(built_book, n)] == []


class CopyRuns:
    """The nbval runs of the reader's copies that the build's execution does not stand for, two at a time.

    The build executed every chapter's code (the copy's code cells are the chapter's:
    ``test_reader_copy_has_no_raw_myst_and_no_visible_solution``) on the newcomer's data. A copy is
    executed again, alone in a folder outside the repository and with the data sets, only where the
    chapter asked the build for a data set it did not have: there the copy takes another path.
    The runs start together at the first one asked for, ``jobs`` at a time (each kernel computes on
    one thread).
    """

    def __init__(self, copies: dict[str, Path], built_book: Path, tmp_factory, jobs: int):
        self.copies, self.tmp_factory = copies, tmp_factory
        self.missed = {name: missed_data(built_book, name) for name in copies}
        self.pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        self.futures: dict = {}

    def result(self, name: str) -> subprocess.CompletedProcess:
        if not self.futures:
            for n in sorted(n for n in self.copies if self.missed[n]):
                self.futures[n] = self.pool.submit(self._run, n)
        return self.futures[name].result()

    def _run(self, name: str) -> subprocess.CompletedProcess:
        folder = self.tmp_factory.mktemp(Path(name).stem)
        nb = folder / name
        nb.write_text(self.copies[name].read_text(encoding="utf-8"), encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--nbval-lax",
                "--rootdir",
                str(folder),
                str(nb),
            ],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )


@pytest.fixture(scope="module")
def copy_runs(copies, built_book, tmp_path_factory):
    from tests.conftest import BUILD_JOBS

    runs = CopyRuns(copies, built_book, tmp_path_factory, BUILD_JOBS)
    yield runs
    runs.pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("name", [p.name for p in CHAPTERS])
def test_reader_copy_runs_top_to_bottom(copy_runs, built_book, name):
    """Each copy runs top to bottom with the data sets: under nbval (lax), alone in a folder outside the
    repository, where its chapter asked the build for a data set it lacked; else the build's execution
    of the same code on the same data stands for it (executed once, with no error output)."""
    if copy_runs.missed[name]:
        proc = copy_runs.result(name)
        assert proc.returncode == 0, f"missed in the build: {copy_runs.missed[name]}\n{proc.stdout[-6000:]}"
        return
    executed = json.loads((built_book.parent / "jupyter_execute" / "book" / name).read_text(encoding="utf-8"))
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code and all(c.get("execution_count") for c in code if rc._source(c).strip()), "a code cell was not executed"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []

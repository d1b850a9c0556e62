"""Headless Debian chromium driven by Playwright, against real servers (tests/support.py).

Never ``playwright install``: the browser is the system's ``/usr/bin/chromium``. Pages run under
the server's Content-Security-Policy, so tests wait with locators and ``expect`` (which need no
``eval`` in the page) rather than ``wait_for_function``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect
from wschat.server.engine import GenerationRequest

from tests.fakes.scripted import Script

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
STEP_MS = 15_000  # Playwright's own timeout for each wait and action
expect.set_options(timeout=STEP_MS)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)")
    async with async_playwright() as p:
        async with asyncio.timeout(60):
            launched = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            async with asyncio.timeout(60):
                await launched.close()


NewPage = Callable[..., Awaitable[Page]]


@pytest.fixture
async def new_page(browser: Browser) -> AsyncIterator[NewPage]:
    """Pages that fail the test on any uncaught script error."""
    errors: list[str] = []

    async def make(**context_options: Any) -> Page:
        options: dict[str, Any] = {"viewport": {"width": 1200, "height": 760}, **context_options}
        context = await browser.new_context(**options)
        page = await context.new_page()
        page.set_default_timeout(STEP_MS)
        page.on("pageerror", lambda error: errors.append(str(error)))
        return page

    yield make
    assert errors == [], f"uncaught errors in the page: {errors}"


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where tests write screenshots: $WSCHAT_SCREENSHOTS, else a temporary folder."""
    folder = os.environ.get("WSCHAT_SCREENSHOTS")
    if folder:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("screenshots")


def http_base(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    return f"http://{parts.netloc}"


def anonymous_id(session_key: str) -> str:
    """How the dashboard names a session (server/web/stats_feed.py)."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:10]


PHONE = {"width": 390, "height": 844}


async def page_width(page: Page) -> int:
    """The page's width, scrolled sideways included (a mobile viewport widens to fit what
    overflows it, so innerWidth would follow the page)."""
    return int(await page.evaluate("() => document.documentElement.scrollWidth"))


async def shown_whole(locator: Locator, width: int = PHONE["width"]) -> bool:
    """Whether the element lies within ``width`` from the left and its text is not cut short."""
    return bool(
        await locator.evaluate(
            """(e, width) => {
              const box = e.getBoundingClientRect();
              return box.left >= 0 && box.right <= width && e.scrollWidth <= e.clientWidth;
            }""",
            width,
        )
    )


async def lines(locator: Locator) -> int:
    """How many lines an element's text takes: its content's height over its line height."""
    return int(
        await locator.evaluate(
            """(e) => {
              const s = getComputedStyle(e);
              const padding = parseFloat(s.paddingTop) + parseFloat(s.paddingBottom);
              return Math.round((e.clientHeight - padding) / parseFloat(s.lineHeight));
            }"""
        )
    )


def words(n: int, delay_s: float = 0.0, stem: str = "w") -> Script:
    return Script([f" {stem}{i}" for i in range(n)], delay_s=delay_s)


def in_turn(*scripts: Script) -> Callable[[GenerationRequest], Script]:
    """A ScriptedEngine script: one reply per prompt in order, the last one repeated."""
    queue = list(scripts)

    def next_script(request: GenerationRequest) -> Script:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return next_script

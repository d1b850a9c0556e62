"""The chat page on the embedded Gemma 3 270M, as the README's run command serves it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from playwright.async_api import expect
from wschat.server.engine.embedded import EMBEDDED_ABOUT, EMBEDDED_ANSWERED

from tests.support import running_server

from .chat import ChatPage
from .conftest import NewPage, http_base

pytestmark = [pytest.mark.browser, pytest.mark.real_model]

WATCH_GROWTH = """() => {
  window.lengths = [];
  new MutationObserver(() => {
    const reply = document.querySelector(".msg.assistant .text");
    if (reply) window.lengths.push(reply.textContent.length);
  }).observe(document.getElementById("transcript"),
    { subtree: true, childList: true, characterData: true });
}"""


def embedded_engine() -> object:
    """The embedded model as the runtime builds it (``make_engine``: its ``about`` line too)."""
    from wschat.server.runtime.engines import make_engine
    from wschat.server.settings import Settings

    return make_engine(Settings(engine="generate"))


async def test_embedded_gemma_streams_a_reply_into_the_page(
    new_page: NewPage, screenshots: Path
) -> None:
    async with asyncio.timeout(600):  # converts the GGUF on first use (about a minute)
        engine = await asyncio.to_thread(embedded_engine)
    async with running_server(engine) as url:  # type: ignore[arg-type]
        chat = await ChatPage(await new_page(), http_base(url)).open()
        await expect(chat.page.locator("#model")).to_contain_text("gemma")
        # the empty page says what the model can do, with its measured answer rate
        about = chat.page.locator("#about")
        await expect(about).to_have_text(EMBEDDED_ABOUT)
        await expect(about).to_contain_text(f"{EMBEDDED_ANSWERED[0]} of {EMBEDDED_ANSWERED[1]}")
        await chat.page.evaluate(WATCH_GROWTH)
        reply = await chat.send("What is the capital of France?")
        # the base model ends its reply itself (where it starts the next turn), before any limit
        await expect(reply).to_have_attribute("data-reason", "stop", timeout=120_000)
        await expect(chat.text(reply)).to_contain_text("Paris")
        lengths = await chat.page.evaluate("() => window.lengths")
        assert len(set(lengths)) >= 3, lengths  # it grew token by token
        await expect(reply.locator(".meta")).to_contain_text("tokens/s")
        second = await chat.send("What do bees make?")  # a follow-up in the same conversation
        await expect(second).to_have_attribute("data-reason", "stop", timeout=120_000)
        await expect(chat.text(second)).to_have_text(re.compile(r"\w+"))
        await chat.page.screenshot(path=screenshots / "chat.png")

"""The chat page on the embedded Gemma 3 270M, as the README's run command serves it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from playwright.async_api import expect

from tests.support import running_server

from .chat import ChatPage
from .conftest import NewPage, http_base

pytestmark = [pytest.mark.browser, pytest.mark.real_model]

SOME_WORDS = re.compile(r"(\S+\s+){6}")
FINISHED = re.compile(r"^(stop|length)$")
WATCH_GROWTH = """() => {
  window.lengths = [];
  new MutationObserver(() => {
    const reply = document.querySelector(".msg.assistant .text");
    if (reply) window.lengths.push(reply.textContent.length);
  }).observe(document.getElementById("transcript"), { subtree: true, characterData: true });
}"""


def embedded_engine() -> object:
    from wschat.server.engine.hf import HFEngine
    from wschat.server.loader import load_model

    return HFEngine(load_model("embedded"))


async def test_embedded_gemma_streams_a_reply_into_the_page(
    new_page: NewPage, screenshots: Path
) -> None:
    async with asyncio.timeout(600):  # converts the GGUF on first use (about a minute)
        engine = await asyncio.to_thread(embedded_engine)
    async with running_server(engine) as url:  # type: ignore[arg-type]
        chat = await ChatPage(await new_page(), http_base(url)).open()
        await expect(chat.page.locator("#model")).to_contain_text("gemma")
        await chat.page.get_by_label("Max new tokens").fill("40")
        await chat.page.evaluate(WATCH_GROWTH)
        reply = await chat.send("Write two sentences about the sea.")
        await expect(reply.locator(".meta")).to_have_text("Generating…", timeout=120_000)
        # a few words in (the reply may also have finished by then: the screenshot is a picture)
        await expect(chat.text(reply)).to_have_text(SOME_WORDS, timeout=120_000)
        await chat.page.screenshot(path=screenshots / "chat-gemma.png")
        await expect(reply).to_have_attribute("data-reason", FINISHED, timeout=120_000)
        reason = await reply.get_attribute("data-reason")
        assert reason in ("stop", "length")
        text = await chat.text(reply).text_content()
        assert text and text.strip()
        lengths = await chat.page.evaluate("() => window.lengths")
        assert len(set(lengths)) >= 3, lengths
        await expect(reply.locator(".meta")).to_contain_text("tokens/s")
        second = await chat.send("Now one more, shorter.")
        await expect(second).to_have_attribute("data-reason", FINISHED, timeout=120_000)

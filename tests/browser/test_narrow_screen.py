"""The chat page on a phone's screen (390 x 844 CSS pixels): nothing wider than the screen, the
model's name whole on a line of its own under the header, the settings folded away until asked
for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from playwright.async_api import expect

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

from .chat import ChatPage
from .conftest import PHONE, NewPage, http_base, in_turn, lines, page_width, shown_whole

pytestmark = pytest.mark.browser

MODEL = "google/gemma-3-270m-it (embedded GGUF, Q8_0, batched, flash-attn varlen)"
REPLY = """Three ways to **reverse a list** in Python:

1. `items.reverse()` changes the list in place.
2. `reversed(items)` gives an iterator.
3. Slicing makes a copy:

```python
backwards = items[::-1]  # a copy, the original is left as it was, however long this line is
```
"""


async def test_the_chat_page_fits_a_phone_screen(new_page: NewPage, screenshots: Path) -> None:
    lines_of_reply = [f"{line}\n" for line in REPLY.split("\n")[:-1]]
    engine = ScriptedEngine(in_turn(Script(lines_of_reply, delay_s=0.02)))
    engine.info = dataclasses.replace(engine.info, model=MODEL)
    async with running_server(engine) as url:
        page = await new_page(viewport=PHONE, is_mobile=True, has_touch=True)
        chat = await ChatPage(page, http_base(url)).open()
        model = page.locator("#model")
        await expect(model).to_have_text(MODEL)
        await expect(model).to_be_visible()
        assert await shown_whole(model)  # not cut: scrollWidth <= clientWidth, within the screen
        assert await lines(model) <= 2
        dashboard = page.get_by_role("link", name="Dashboard")
        await expect(dashboard).to_be_visible()
        assert await shown_whole(dashboard)

        system = page.get_by_label("Instructions for the model")
        await expect(system).to_be_hidden()
        await expect(page.get_by_label("Temperature")).to_be_hidden()
        assert await chat.finished(await chat.send("how do I reverse a list?")) == "stop"
        await expect(chat.replies.first.locator("pre code")).to_contain_text("items[::-1]")
        assert await page_width(page) <= PHONE["width"]
        await page.screenshot(path=screenshots / "chat-mobile.png")

        # the inline editor of a message fits too, its buttons whole
        await chat.messages.first.get_by_role("button", name="Edit").click()
        await expect(page.get_by_role("textbox", name="Edit message 1")).to_be_focused()
        assert await page_width(page) <= PHONE["width"]
        assert await shown_whole(page.get_by_role("button", name="Save"))
        await page.keyboard.press("Escape")

        await page.locator("summary", has_text="Settings").click()
        await expect(system).to_be_visible()
        await expect(page.get_by_label("Temperature")).to_be_visible()
        assert await page_width(page) <= PHONE["width"]


async def test_the_chat_page_fits_the_narrowest_phone_with_its_links_whole(
    new_page: NewPage,
) -> None:
    width = 320
    lines_of_reply = [f"{line}\n" for line in REPLY.split("\n")[:-1]]
    engine = ScriptedEngine(in_turn(Script(lines_of_reply)))
    engine.info = dataclasses.replace(engine.info, model=MODEL)
    async with running_server(engine) as url:
        page = await new_page(viewport={**PHONE, "width": width}, is_mobile=True, has_touch=True)
        chat = await ChatPage(page, http_base(url)).open()
        assert await chat.finished(await chat.send("how do I reverse a list?")) == "stop"
        await page.locator("summary", has_text="Settings").click()
        await expect(page.get_by_label("Temperature")).to_be_visible()
        assert await page_width(page) <= width
        assert await shown_whole(page.get_by_role("link", name="Dashboard"), width)

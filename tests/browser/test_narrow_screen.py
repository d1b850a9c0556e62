"""The chat page on a phone's screen (390 x 844 CSS pixels): nothing wider than the screen, the
header on one line, the settings folded away until asked for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from playwright.async_api import Locator, expect

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

from .chat import ChatPage
from .conftest import NewPage, http_base, in_turn, lines

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
MODEL = "google/gemma-3-270m-it (embedded GGUF, Q8_0, batched, flash-attn varlen)"
REPLY = """Three ways to **reverse a list** in Python:

1. `items.reverse()` changes the list in place.
2. `reversed(items)` gives an iterator.
3. Slicing makes a copy:

```python
backwards = items[::-1]  # a copy, the original is left as it was, however long this line is
```
"""


async def inside_the_screen(locator: Locator) -> bool:
    """Whether the element is shown whole: within the viewport's width and not cut short."""
    return bool(
        await locator.evaluate(
            """(e) => {
              const box = e.getBoundingClientRect();
              return box.left >= 0 && box.right <= innerWidth && e.scrollWidth <= e.clientWidth;
            }"""
        )
    )


async def test_the_chat_page_fits_a_phone_screen(new_page: NewPage, screenshots: Path) -> None:
    engine = ScriptedEngine(in_turn(Script([f"{line}\n" for line in REPLY.split("\n")[:-1]])))
    engine.info = dataclasses.replace(engine.info, model=MODEL)
    async with running_server(engine) as url:
        page = await new_page(viewport=PHONE, is_mobile=True, has_touch=True)
        chat = await ChatPage(page, http_base(url)).open()
        model = page.locator("#model")
        await expect(model).to_have_text(MODEL)
        await expect(model).to_have_attribute("title", MODEL)
        assert await lines(model) == 1
        assert await model.evaluate("(e) => e.scrollWidth > e.clientWidth")  # cut with an ellipsis
        dashboard = page.get_by_role("link", name="Dashboard")
        await expect(dashboard).to_be_visible()
        assert await inside_the_screen(dashboard)

        system = page.get_by_label("Instructions for the model")
        await expect(system).to_be_hidden()
        await expect(page.get_by_label("Temperature")).to_be_hidden()
        assert await chat.finished(await chat.send("how do I reverse a list?")) == "stop"
        await expect(chat.replies.first.locator("pre code")).to_contain_text("items[::-1]")
        assert await page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        await page.screenshot(path=screenshots / "chat-mobile.png")

        await page.locator("summary", has_text="Settings").click()
        await expect(system).to_be_visible()
        await expect(page.get_by_label("Temperature")).to_be_visible()
        assert await page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")

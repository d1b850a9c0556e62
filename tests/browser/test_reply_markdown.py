"""A reply's markdown rendered in the chat page: as it streams, with nothing the model writes
run as HTML or script, and code blocks with a copy button."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

from .chat import ChatPage
from .conftest import NewPage, http_base, in_turn

pytestmark = pytest.mark.browser

CODE = 'print("hi")'
REPLY = f"""Here is **bold** text.

- first item
- second item

```python
{CODE}
```

<img src=x onerror="window.injected = 1"> and <script>window.injected = 2</script>

![remote](https://example.com/pixel.png) [a trap](javascript:window.injected=3) and [safe](https://example.com/)
<JAVASCRIPT:window.injected=4> [data](data:text/html,hi) [here](/dashboard) [ref][r]
mail a@b.example

[r]: javascript:window.injected=5
"""
# what the page may have made of the model's HTML, links and images
INJECTED = "img, script, iframe, a[href^='javascript'], [onerror]"


def pieces(text: str, size: int = 3) -> list[str]:
    """The text as tokens of a few characters: markup arrives split across frames."""
    return [text[i : i + size] for i in range(0, len(text), size)]


async def test_a_replys_markdown_is_rendered_and_its_html_is_shown_as_text(
    new_page: NewPage, screenshots: Path
) -> None:
    engine = ScriptedEngine(in_turn(Script(pieces(REPLY), delay_s=0.005)))
    async with running_server(engine) as url:
        page = await new_page(permissions=["clipboard-read", "clipboard-write"])
        chat = await ChatPage(page, http_base(url)).open()
        reply = await chat.send("show me some markdown")
        assert await chat.finished(reply) == "stop"
        text = chat.text(reply)
        await expect(text.locator("strong")).to_have_text("bold")
        await expect(text.get_by_role("listitem")).to_have_text(["first item", "second item"])
        await expect(text.locator("pre code")).to_have_text(CODE)
        await expect(text).to_contain_text('<img src=x onerror="window.injected = 1">')
        await expect(text).to_contain_text("<script>window.injected = 2</script>")
        await expect(page.locator(f".transcript :is({INJECTED})")).to_have_count(0)
        safe = text.get_by_role("link", name="safe")
        await expect(safe).to_have_attribute("href", "https://example.com/")
        await expect(safe).to_have_attribute("rel", "noopener noreferrer nofollow")
        hrefs = await text.locator("a").evaluate_all("(links) => links.map((a) => a.href)")
        assert hrefs == [
            "https://example.com/pixel.png",  # an image is a link, never loaded
            "https://example.com/",
            "mailto:a@b.example",
        ]
        assert await page.evaluate("() => window.injected") is None

        copy = text.get_by_role("button", name="Copy code")
        await copy.focus()
        await page.keyboard.press("Enter")
        await expect(text.get_by_role("button", name="Code copied")).to_be_visible()
        assert await page.evaluate("() => navigator.clipboard.readText()") == CODE + "\n"
        await page.screenshot(path=screenshots / "chat-markdown.png")


async def test_markdown_renders_while_the_reply_streams(new_page: NewPage) -> None:
    head = "Start with **bold** words.\n\n```js\nlet x = 1;\n"
    tail = "```\n\nThe end."
    script = Script([*pieces(head), *pieces(tail)], stall_after=len(pieces(head)))
    engine = ScriptedEngine(in_turn(script))
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        reply = await chat.send("stream some markdown")
        text = chat.text(reply)
        # the fence is still open: what came so far is a code block already
        await expect(text.locator("pre code")).to_have_text("let x = 1;")
        await expect(text.locator("strong")).to_have_text("bold")
        await expect(reply).to_have_class("msg assistant streaming")
        await expect(reply).to_have_attribute("aria-busy", "true")  # read once it is whole
        assert await reply.get_attribute("data-reason") is None
        engine.unstall()
        assert await chat.finished(reply) == "stop"
        await expect(text.locator("pre code")).to_have_text("let x = 1;")
        await expect(text.locator("p").last).to_have_text("The end.")
        await expect(text.locator("pre")).to_have_count(1)
        await expect(reply).not_to_have_attribute("aria-busy", "true")

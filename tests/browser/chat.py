"""``ChatPage``: the chat page as a test drives it, through its labelled controls."""

from __future__ import annotations

import base64
import re
from typing import Any

import msgpack
from playwright.async_api import Locator, Page, expect

_ANY = re.compile(".+")


class ChatPage:
    def __init__(self, page: Page, base: str) -> None:
        self.page = page
        self.base = base
        self.conn = page.locator("#conn")
        self.input = page.get_by_label("Message", exact=True)
        self.replies = page.locator(".msg.assistant")
        self.messages = page.locator("#transcript > li")
        self.notices = page.locator("#notices")

    async def open(self) -> ChatPage:
        await self.page.goto(self.base + "/")
        await self.connected()
        return self

    async def connected(self) -> None:
        await expect(self.conn).to_have_attribute("data-state", "connected")

    async def session(self) -> str:
        await self.connected()
        key = await self.page.locator("body").get_attribute("data-session")
        assert key
        return key

    async def send(self, text: str) -> Locator:
        """Type and press Enter; the new reply bubble."""
        count = await self.replies.count()
        await self.input.fill(text)
        await self.input.press("Enter")
        reply = self.replies.nth(count)
        await expect(reply).to_be_visible()
        return reply

    async def finished(self, reply: Locator) -> str:
        """Wait for the reply's done; its finish reason."""
        await expect(reply).to_have_attribute("data-reason", _ANY)
        reason = await reply.get_attribute("data-reason")
        assert reason
        return reason

    @staticmethod
    def text(reply: Locator) -> Locator:
        return reply.locator(".text")


# Keeps every frame the page's sockets send and receive, as base64 (init script: it runs before
# the page's own, and outside its Content-Security-Policy).
RECORD_FRAMES = """(() => {
  const Native = window.WebSocket;
  const b64 = (data) => {
    let s = "";
    for (const b of new Uint8Array(data)) s += String.fromCharCode(b);
    return btoa(s);
  };
  window.recordedFrames = { received: [], sent: [] };
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (e) => {
        if (e.data instanceof ArrayBuffer) window.recordedFrames.received.push(b64(e.data));
      });
    }
    send(data) {
      window.recordedFrames.sent.push(b64(data));
      super.send(data);
    }
  };
})()"""

# The page's exchanges in order, as [role, data-turn, text].
SHOWN = """() => [...document.querySelectorAll("#transcript > li.msg")].map((li) => [
  li.classList.contains("user") ? "user" : "assistant",
  li.dataset.turn ?? null,
  (li.querySelector(":scope > .text") || { textContent: "" }).textContent.trim(),
])"""


async def record_frames(page: Page) -> None:
    await page.add_init_script(RECORD_FRAMES)


async def frames(page: Page, direction: str = "received") -> list[dict[str, Any]]:
    """The frames recorded so far (``record_frames``), decoded."""
    encoded = await page.evaluate(f"() => window.recordedFrames.{direction}")
    return [msgpack.unpackb(base64.b64decode(f)) for f in encoded]


def conversation_of(received: list[dict[str, Any]]) -> list[str]:
    """The server's conversation as a client of its frames knows it: each kept reply's text at
    its ``done.turn`` (a new exchange at the end, a regenerate in place), cut by ``rewound``."""
    replies: list[str] = []
    for frame in received:
        if frame["type"] == "done" and frame["turn"] is not None:
            turn = frame["turn"]
            assert turn in (len(replies), len(replies) + 1), (turn, replies)
            replies[turn - 1 :] = [frame["text"]]
        elif frame["type"] == "rewound":
            del replies[frame["turns"] :]
        elif frame["type"] == "reset_ok":
            replies = []
    return replies


async def shown(page: Page) -> list[list[str | None]]:
    return list(await page.evaluate(SHOWN))


async def shown_conversation(page: Page) -> list[str]:
    """The replies the page shows as the conversation's (its exchanges marked kept)."""
    return [
        text or ""
        for role, turn, text in await shown(page)
        if role == "assistant" and turn not in (None, "none")
    ]

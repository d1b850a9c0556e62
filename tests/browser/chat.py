"""``ChatPage``: the chat page as a test drives it, through its labelled controls."""

from __future__ import annotations

import re

from playwright.async_api import Locator, Page, expect

_ANY = re.compile(".+")


class ChatPage:
    def __init__(self, page: Page, base: str) -> None:
        self.page = page
        self.base = base
        self.conn = page.locator("#conn")
        self.input = page.get_by_label("Message")
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

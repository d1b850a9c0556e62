"""Images on the chat page: picker, paste and drag-and-drop, each checked by the server at once
(``image`` frames) and sent with the next prompt; refusals show the server's own message."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image as PILImage
from playwright.async_api import FilePayload, Page, expect
from wschat.server.engine.local.hf import HFEngine

from tests.fakes.scripted import ScriptedEngine
from tests.support import running_server

from .chat import ChatPage
from .conftest import NewPage, http_base, in_turn, words

pytestmark = pytest.mark.browser

BY = "\N{MULTIPLICATION SIGN}"  # how the page writes an image's size

# Hands the page a File the way a clipboard paste or a drop onto the composer does.
DELIVER_FILE = """([how, name, type, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], name, { type }));
  const event = how === "paste"
    ? new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true })
    : new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true });
  document.getElementById(how === "paste" ? "input" : "composer").dispatchEvent(event);
}"""


def png(width: int, height: int, colour: str = "teal", kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    PILImage.new("RGB", (width, height), colour).save(buffer, kind)
    return buffer.getvalue()


async def deliver(page: Page, how: str, name: str, mime: str, data: bytes) -> None:
    await page.evaluate(DELIVER_FILE, [how, name, mime, base64.b64encode(data).decode()])


async def test_picked_image_is_checked_then_goes_with_the_next_prompt(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(4)), images=True)
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        await expect(page.get_by_role("button", name="Attach image")).to_be_visible()
        await page.locator("#file").set_input_files(
            files=[FilePayload(name="dot.png", mimeType="image/png", buffer=png(64, 48))]
        )
        attachment = page.locator("#attachments .attachment")
        await expect(attachment).to_have_class("attachment ok")
        await expect(attachment.locator(".caption")).to_have_text(f"64{BY}48")
        reply = await chat.send("What is in this picture?")
        assert await chat.finished(reply) == "stop"
        await expect(attachment).to_have_count(0)
        await expect(chat.messages.first.locator(".thumbs img")).to_have_count(1)
        (request,) = engine.requests
        assert [image.size for image in request.images] == [(64, 48)]


async def test_pasted_and_dropped_images_are_attached_in_order(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(2)), images=True)
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        await deliver(chat.page, "paste", "pasted.png", "image/png", png(10, 20))
        await deliver(chat.page, "drop", "dropped.jpg", "image/jpeg", png(30, 40, kind="JPEG"))
        captions = chat.page.locator("#attachments .caption")
        await expect(captions).to_have_text([f"10{BY}20", f"30{BY}40"])
        await chat.input.fill("two pictures")
        await chat.page.get_by_role("button", name="Send").click()
        assert await chat.finished(chat.replies.first) == "stop"
        assert [image.size for image in engine.requests[0].images] == [(10, 20), (30, 40)]


async def test_image_the_text_model_refuses_shows_the_servers_message(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(2)))  # a text-only model
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        await expect(page.get_by_role("button", name="Attach image")).to_be_hidden()
        await deliver(page, "drop", "photo.png", "image/png", png(8, 8))
        refused = page.locator("#attachments .attachment.refused")
        await expect(refused.locator(".caption")).to_have_text(
            "the model 'scripted' does not read images"
        )
        await page.get_by_role("button", name="Dismiss refused image").click()
        await expect(refused).to_have_count(0)
        assert await chat.finished(await chat.send("text still works")) == "stop"
        assert engine.requests[0].images == []


async def test_undecodable_and_oversized_images_are_refused_with_a_reason(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(2)), images=True)
    async with running_server(engine, max_image_bytes=50_000) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        await deliver(page, "drop", "fake.png", "image/png", b"\x89PNG\r\n\x1a\n not really")
        big = png(400, 400, kind="BMP")  # 480 kB: refused before it is sent
        await deliver(page, "drop", "huge.bmp", "image/bmp", big)
        captions = page.locator("#attachments .attachment.refused .caption")
        await expect(captions.first).not_to_have_text("checking…")
        messages = await captions.all_text_contents()
        assert len(messages) == 2
        assert "image" in messages[0] and messages[0] != "checking…"
        assert messages[1] == "469 kB is over the server's 49 kB limit"


FINISHED = re.compile(r"^(stop|length)$")


async def test_tiny_text_model_replies_and_refuses_an_image(
    new_page: NewPage, tiny_text_engine: HFEngine
) -> None:
    async with running_server(tiny_text_engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        await expect(page.get_by_role("button", name="Attach image")).to_be_hidden()
        await deliver(page, "paste", "photo.png", "image/png", png(8, 8))
        caption = page.locator("#attachments .attachment.refused .caption")
        await expect(caption).to_have_text(
            f"the model {tiny_text_engine.info.model!r} does not read images"
        )
        await page.get_by_label("Max new tokens").fill("12")
        reply = await chat.send("hello")
        await expect(reply).to_have_attribute("data-reason", FINISHED)
        await expect(reply.locator(".meta")).to_contain_text("first token")


async def test_tiny_vision_model_replies_to_an_attached_image(
    new_page: NewPage, tiny_vision_engine: HFEngine
) -> None:
    async with running_server(tiny_vision_engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        await page.get_by_label("Max new tokens").fill("12")
        await page.locator("#file").set_input_files(
            files=[FilePayload(name="red.png", mimeType="image/png", buffer=png(32, 32, "red"))]
        )
        await expect(page.locator("#attachments .attachment.ok .caption")).to_have_text(f"32{BY}32")
        reply = await chat.send("What colour is this?")
        await expect(reply).to_have_attribute("data-reason", FINISHED)
        await expect(reply.locator(".error-text")).to_have_count(0)
        await expect(chat.messages.first.locator(".thumbs img")).to_have_count(1)
        await expect(reply.locator(".meta")).to_contain_text("first token")

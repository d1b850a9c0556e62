"""Edit and Regenerate on the chat page (PROTOCOL.md ``rewind``, ``regenerate``): found by role
and name, used with the mouse and with the keyboard alone, and the page's transcript always the
server's conversation, as its ``done`` and ``rewound`` frames tell it."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.async_api import FilePayload, Page, expect

from tests.fakes.scripted import Script, ScriptedEngine
from tests.proxy import cuttable_proxy
from tests.support import running_server

from .chat import ChatPage, conversation_of, frames, record_frames, shown, shown_conversation
from .conftest import NewPage, http_base, in_turn, words
from .test_images import png

pytestmark = pytest.mark.browser

BUSY = "Stop the reply or wait for it to finish first"  # why Edit and Regenerate are off


async def open_recorded(page: Page, url: str) -> ChatPage:
    await record_frames(page)
    return await ChatPage(page, http_base(url)).open()


async def converse(chat: ChatPage, *texts: str) -> None:
    for text in texts:
        assert await chat.finished(await chat.send(text)) == "stop"


async def assert_page_is_the_conversation(chat: ChatPage, engine: ScriptedEngine) -> None:
    """The replies the page shows as kept are the ones the server's frames kept, in order, and
    its user messages are the user turns of the server's last request (which was kept)."""
    replies = conversation_of(await frames(chat.page))
    assert await shown_conversation(chat.page) == [r.strip() for r in replies]
    request = engine.requests[-1]
    users = [engine.decode(m.ids) for m in request.messages if m.role == "user"]
    page = await shown(chat.page)
    assert [text for role, turn, text in page if role == "user" and turn != "none"] == users
    assert len(users) == len(replies)


async def test_regenerate_replaces_the_last_reply_in_place(new_page: NewPage) -> None:
    engine = ScriptedEngine(
        in_turn(words(3, stem="a"), words(3, stem="b"), words(300, delay_s=0.01, stem="c"))
    )
    async with running_server(engine) as url:
        chat = await open_recorded(await new_page(), url)
        page = chat.page
        await converse(chat, "first", "second")
        regenerate = page.get_by_role("button", name="Regenerate")
        await expect(regenerate).to_have_count(1)  # the last reply's only
        await expect(chat.replies.nth(1).get_by_role("button", name="Regenerate")).to_be_visible()
        await page.get_by_label("Temperature").fill("0.7")
        await regenerate.click()
        await expect(chat.replies).to_have_count(2)
        fresh = chat.replies.nth(1)
        await expect(chat.text(fresh)).to_contain_text("c5")  # streams where the old one was
        await expect(page.get_by_text("b0 b1 b2")).to_have_count(0)
        # while it runs, nothing can be steered: the buttons say why
        edit = page.get_by_role("button", name="Edit message 1")
        await expect(edit).to_be_disabled()
        await expect(edit).to_have_attribute("title", BUSY)
        await expect(regenerate).to_have_count(0)
        assert await chat.finished(fresh) == "stop"
        await expect(regenerate).to_be_enabled()
        await expect(edit).to_be_enabled()
    sent = await frames(page, "sent")
    assert sent[-1]["type"] == "regenerate" and sent[-1]["params"]["temperature"] == 0.7
    assert "seed" not in sent[-1]["params"]  # a sampled reply drawn afresh
    request = engine.requests[-1]
    assert request.params.temperature == 0.7
    assert [engine.decode(m.ids) for m in request.messages if m.role == "user"] == [
        "first",
        "second",
    ]
    assert [f["turn"] for f in await frames(page) if f["type"] == "done"] == [1, 2, 2]
    assert await shown_conversation(page) == ["a0 a1 a2", " ".join(f"c{i}" for i in range(300))]
    await assert_page_is_the_conversation(chat, engine)


async def test_edit_of_the_second_of_three_messages_drops_the_later_turns(
    new_page: NewPage,
) -> None:
    scripts = [words(3, stem=stem) for stem in "abc"] + [words(200, delay_s=0.01, stem="d")]
    engine = ScriptedEngine(in_turn(*scripts))
    async with running_server(engine) as url:
        chat = await open_recorded(await new_page(), url)
        page = chat.page
        await converse(chat, "one", "two", "three")
        await expect(page.get_by_role("button", name="Edit message 3")).to_be_visible()
        await chat.messages.nth(2).get_by_role("button", name="Edit").click()
        editor = page.get_by_role("textbox", name="Edit message 2")
        await expect(editor).to_be_focused()
        await expect(editor).to_have_value("two")
        await editor.fill("two, but better")
        await page.get_by_role("button", name="Save").click()
        await expect(editor).to_have_count(0)
        fresh = chat.replies.nth(1)
        await expect(chat.text(fresh)).to_contain_text("d3")
        await expect(chat.messages).to_have_count(4)  # the third exchange went
        await expect(chat.messages.nth(2).locator(".text")).to_have_text("two, but better")
        assert await chat.finished(fresh) == "stop"
        await expect(page.get_by_role("button", name="Regenerate")).to_be_visible()
        received = await frames(page)
    sent = [f for f in await frames(page, "sent") if f["type"] in ("rewind", "prompt")]
    assert [f["type"] for f in sent[-2:]] == ["rewind", "prompt"]
    assert sent[-2]["keep"] == 1 and sent[-1]["text"] == "two, but better"
    rewound = [f for f in received if f["type"] == "rewound"]
    assert rewound == [{"type": "rewound", "turns": 1}]
    assert [f["turn"] for f in received if f["type"] == "done"] == [1, 2, 3, 2]
    assert [engine.decode(m.ids) for m in engine.requests[-1].messages if m.role == "user"] == [
        "one",
        "two, but better",
    ]
    await assert_page_is_the_conversation(chat, engine)


async def test_edit_with_the_keyboard_alone(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(2, stem="a"), words(2, stem="b")))
    async with running_server(engine) as url:
        chat = await open_recorded(await new_page(), url)
        page = chat.page
        await converse(chat, "hello")
        edit = page.get_by_role("button", name="Edit message 1")
        await expect(chat.input).to_be_focused()
        for _ in range(10):  # back from the message box to the message's Edit button
            await page.keyboard.press("Shift+Tab")
            if await edit.evaluate("(e) => e === document.activeElement"):
                break
        await expect(edit).to_be_focused()
        await page.keyboard.press("Enter")
        editor = page.get_by_role("textbox", name="Edit message 1")
        await expect(editor).to_be_focused()
        await page.keyboard.type(" there")
        await page.keyboard.press("Escape")  # puts the message back as it was
        await expect(editor).to_have_count(0)
        await expect(edit).to_be_focused()
        await expect(chat.messages.first.locator(".text")).to_have_text("hello")
        await page.keyboard.press("Enter")
        await expect(editor).to_have_value("hello")
        await page.keyboard.type(", world")
        await page.keyboard.press("Enter")
        await expect(chat.messages.first.locator(".text")).to_have_text("hello, world")
        await expect(chat.text(chat.replies.first)).to_have_text(" b0 b1")
        assert await chat.finished(chat.replies.first) == "stop"
        await expect(chat.input).to_be_focused()
        await expect(chat.messages).to_have_count(2)
    await assert_page_is_the_conversation(chat, engine)


async def test_a_regenerate_that_fails_leaves_the_old_reply(new_page: NewPage) -> None:
    failing = Script([" x0", " x1", " x2"], fail_after=2)
    engine = ScriptedEngine(in_turn(words(2, stem="a"), failing, words(2, stem="c")))
    async with running_server(engine) as url:
        chat = await open_recorded(await new_page(), url)
        page = chat.page
        await converse(chat, "hi")
        await page.get_by_role("button", name="Regenerate").click()
        await expect(chat.notices).to_contain_text("The new reply was not kept")
        await expect(chat.notices).to_contain_text("The earlier reply stays")
        await expect(chat.replies).to_have_count(1)
        await expect(chat.text(chat.replies.first)).to_have_text(" a0 a1")
        await expect(chat.replies.first).to_have_attribute("data-turn", "1")
        await page.get_by_role("button", name="Regenerate").click()  # and again: it works
        await expect(chat.text(chat.replies.first)).to_have_text(" c0 c1")
        assert await chat.finished(chat.replies.first) == "stop"
    assert [(f["reason"], f["turn"]) for f in await frames(page) if f["type"] == "done"] == [
        ("stop", 1),
        ("error", None),
        ("stop", 1),
    ]
    await assert_page_is_the_conversation(chat, engine)


async def test_a_failed_reply_is_marked_not_kept_and_an_edit_does_not_count_it(
    new_page: NewPage,
) -> None:
    failing = Script([" x0", " x1"], fail_after=1)
    scripts = [words(2, stem="a"), failing, words(2, stem="c"), words(2, stem="d")]
    engine = ScriptedEngine(in_turn(*scripts))
    async with running_server(engine) as url:
        chat = await open_recorded(await new_page(), url)
        page = chat.page
        await converse(chat, "one")
        assert await chat.finished(await chat.send("two")) == "error"
        await expect(chat.replies.nth(1).locator(".badge", has_text="Not kept")).to_be_visible()
        await expect(chat.replies.nth(1)).to_have_attribute("data-turn", "none")
        # the conversation's last reply is the first one: no Regenerate under a failed reply
        await expect(page.get_by_role("button", name="Regenerate")).to_have_count(0)
        await converse(chat, "three")
        await chat.messages.nth(4).get_by_role("button", name="Edit").click()
        editor = page.get_by_role("textbox", name="Edit message 3")
        await editor.fill("three again")
        await editor.press("Enter")
        await expect(chat.messages).to_have_count(6)
        assert await chat.finished(chat.replies.nth(2)) == "stop"
        await expect(chat.text(chat.replies.nth(2))).to_have_text(" d0 d1")
    rewinds = [f for f in await frames(page, "sent") if f["type"] == "rewind"]
    assert rewinds == [{"type": "rewind", "keep": 1}]  # the failed exchange is not counted
    await assert_page_is_the_conversation(chat, engine)


async def test_a_reply_cut_off_by_a_dropped_connection_is_the_servers_after_the_resume(
    new_page: NewPage,
) -> None:
    """The reply ends while the page is away (no grace); the resumed session's ``ready`` says
    the conversation keeps it, and it is the one Regenerate replaces."""
    engine = ScriptedEngine(
        in_turn(words(2, stem="a"), words(400, delay_s=0.02, stem="b"), words(2, stem="c"))
    )
    async with running_server(engine, resume_grace_s=0.0) as url:
        port = urlsplit(url).port
        assert port is not None
        async with cuttable_proxy(port) as proxy:
            page = await new_page()
            await record_frames(page)
            chat = await ChatPage(page, f"http://127.0.0.1:{proxy.port}").open()
            await converse(chat, "one")
            cut = await chat.send("two")
            await expect(chat.text(cut)).to_contain_text("b3")
            proxy.cut()
            await expect(chat.notices).to_contain_text("Reconnected")
            await expect(cut).to_have_attribute("data-turn", "2")
            await page.get_by_role("button", name="Regenerate").click()
            await expect(chat.text(chat.replies.nth(1))).to_have_text(" c0 c1")
            assert await chat.finished(chat.replies.nth(1)) == "stop"
            await expect(chat.replies).to_have_count(2)
    readies = [f for f in await frames(page) if f["type"] == "ready"]
    assert readies[-1]["resumed"]["turns"] == 2
    await assert_page_is_the_conversation(chat, engine)


async def test_an_edited_message_sends_its_images_again(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(2, stem="a"), words(2, stem="b")), images=True)
    picture = png(64, 48)
    async with running_server(engine) as url:
        chat = await open_recorded(await new_page(), url)
        page = chat.page
        await page.locator("#file").set_input_files(
            files=[FilePayload(name="dot.png", mimeType="image/png", buffer=picture)]
        )
        await expect(page.locator("#attachments .attachment")).to_have_class("attachment ok")
        await converse(chat, "What is this?")
        await chat.messages.first.get_by_role("button", name="Edit").click()
        await page.get_by_role("textbox", name="Edit message 1").fill("And what colour is it?")
        await page.get_by_role("button", name="Save").click()
        await expect(chat.text(chat.replies.first)).to_have_text(" b0 b1")
        assert await chat.finished(chat.replies.first) == "stop"
        await expect(chat.messages.first.locator(".thumbs img")).to_have_count(1)
    prompts = [f for f in await frames(page, "sent") if f["type"] == "prompt"]
    assert "images" not in prompts[0]  # it was staged with an image frame
    assert prompts[1]["images"] == [picture]
    messages = engine.requests[-1].messages
    assert [m.role for m in messages] == ["user"]
    assert [image.size for image in messages[0].images] == [(64, 48)]
    await assert_page_is_the_conversation(chat, engine)


async def test_a_regenerate_stopped_while_it_waits_leaves_the_old_reply(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(2, stem="a"), words(400, delay_s=0.02, stem="b")))
    async with running_server(engine, max_concurrent=1, max_queue=1) as url:
        chat = await open_recorded(await new_page(), url)
        await converse(chat, "hi")
        other = await ChatPage(await new_page(), http_base(url)).open()
        running = await other.send("a long one")  # takes the only slot
        await expect(other.text(running)).to_contain_text("b2")
        await chat.page.get_by_role("button", name="Regenerate").click()
        waiting = chat.replies.first
        await expect(waiting.locator(".meta")).to_have_text("Waiting for a free slot (position 1)…")
        await chat.page.get_by_role("button", name="Stop").click()
        await expect(chat.notices).to_contain_text("The new reply was not kept")
        await expect(chat.text(chat.replies.first)).to_have_text(" a0 a1")
        await expect(chat.page.get_by_role("button", name="Regenerate")).to_be_enabled()
        await other.page.get_by_role("button", name="Stop").click()
        assert await other.finished(running) == "cancelled"
    done = [(f["reason"], f["turn"]) for f in await frames(chat.page) if f["type"] == "done"]
    assert done == [("stop", 1), ("cancelled", None)]
    assert await shown_conversation(chat.page) == ["a0 a1"]

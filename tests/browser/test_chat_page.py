"""The chat page against a real server on the scripted engine: streaming, stop, reset, settings,
keyboard and scrolling, as a reader uses them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from playwright.async_api import expect
from wschat.server.engine import SamplingParams

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server

from .chat import ChatPage
from .conftest import NewPage, http_base, in_turn, words

pytestmark = pytest.mark.browser

STORY = (
    "Mara kept the lighthouse on the northern rock for thirty winters. Every evening she climbed"
    " the hundred and twelve steps, trimmed the wick and wound the clockwork that turned the"
    " lamp. Ships she never saw passed safely in the dark, and in the morning she wrote their"
    " lights in her log as if they were letters from old friends."
)

# Records the reply's text length at every change the page makes, to see it grow in steps.
WATCH_GROWTH = """() => {
  window.lengths = [];
  const log = document.getElementById("transcript");
  new MutationObserver(() => {
    const reply = log.querySelector(".msg.assistant:last-of-type .text");
    if (reply) window.lengths.push(reply.textContent.length);
  }).observe(log, { subtree: true, childList: true, characterData: true });
}"""


async def test_reply_grows_in_several_steps_and_shows_its_timing(
    new_page: NewPage, screenshots: Path
) -> None:
    greeting = Script([" Hello!", " What", " shall", " we", " write", " about?"])
    story = Script([f" {w}" for w in STORY.split()], delay_s=0.05)
    async with running_server(ScriptedEngine(in_turn(greeting, story))) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        assert await chat.finished(await chat.send("Hi there")) == "stop"
        await chat.page.evaluate(WATCH_GROWTH)
        reply = await chat.send("A short story about a lighthouse keeper, please.")
        await expect(chat.text(reply)).to_contain_text("lamp")
        await chat.page.screenshot(path=screenshots / "chat-scripted.png")
        assert await chat.finished(reply) == "stop"
        full = "".join(f" {w}" for w in STORY.split())
        await expect(chat.text(reply)).to_have_text(full)
        lengths = await chat.page.evaluate("() => window.lengths")
        steps = sorted(set(lengths))
        # a markdown paragraph, which drops the leading space
        assert len(steps) >= 5 and steps[-1] == len(full.strip()), steps
        assert lengths == sorted(lengths)  # only ever appended to
        meta = reply.locator(".meta")
        await expect(meta).to_contain_text("first token")
        await expect(meta).to_contain_text("tokens/s")
        await expect(meta).to_contain_text(f"{len(STORY.split())} tokens")


async def test_stop_mid_reply_marks_it_stopped_and_the_next_message_works(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(400, delay_s=0.02), words(3)))
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        reply = await chat.send("go on forever")
        await expect(chat.text(reply)).to_contain_text(" w5")
        await chat.page.get_by_role("button", name="Stop").click()
        assert await chat.finished(reply) == "cancelled"
        await expect(reply.locator(".badge")).to_have_text("Stopped")
        stopped_text = await chat.text(reply).text_content()
        assert stopped_text and " w400" not in stopped_text
        second = await chat.send("and now a short one")
        assert await chat.finished(second) == "stop"
        await expect(chat.text(second)).to_have_text(" w0 w1 w2")


async def test_escape_stops_and_shift_enter_adds_a_new_line(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(400, delay_s=0.02)))
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        await chat.input.fill("first line")
        await chat.input.press("Shift+Enter")
        await chat.input.type("second line")
        await expect(chat.input).to_have_value("first line\nsecond line")
        await chat.input.press("Enter")
        reply = chat.replies.first
        await expect(chat.text(reply)).to_contain_text(" w3")
        await chat.page.keyboard.press("Escape")
        assert await chat.finished(reply) == "cancelled"
        await expect(chat.messages.first.locator(".text")).to_have_text("first line\nsecond line")
        user_ids = engine.tokenize_text("first line\nsecond line")
        assert _contains(engine.requests[0].prompt_ids, user_ids)


async def test_new_conversation_clears_the_page_and_the_server_conversation(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(4)))
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        assert await chat.finished(await chat.send("hello")) == "stop"
        assert await chat.finished(await chat.send("again")) == "stop"
        await expect(chat.messages).to_have_count(4)
        await chat.page.get_by_role("button", name="New conversation").click()
        await expect(chat.messages).to_have_count(0)
        await expect(chat.notices).to_contain_text("New conversation")
        assert await chat.finished(await chat.send("hello")) == "stop"
        # the same first prompt after the reset: the server no longer sends the old turns
        assert engine.requests[2].prompt_ids == engine.requests[0].prompt_ids
        assert len(engine.requests[1].prompt_ids) > len(engine.requests[0].prompt_ids)


async def test_system_prompt_and_sampling_settings_reach_the_server(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(3)))
    async with running_server(engine, max_new_tokens=100) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        await expect(page.get_by_label("Max new tokens")).to_have_attribute("max", "100")
        await page.get_by_label("Instructions for the model").fill("Answer like a pirate.")
        await page.get_by_role("button", name="Apply (starts afresh)").click()
        await expect(chat.notices).to_contain_text("System prompt set")
        await page.get_by_label("Temperature").fill("0.5")
        await page.get_by_label("Top-p").fill("0.9")
        await page.get_by_label("Max new tokens").fill("5")
        assert await chat.finished(await chat.send("hi")) == "stop"
        request = engine.requests[-1]
        assert request.params == SamplingParams(max_new_tokens=5, temperature=0.5, top_p=0.9)
        assert _contains(request.prompt_ids, engine.tokenize_text("Answer like a pirate."))
        await page.get_by_label("Max new tokens").fill("101")  # over the server's limit
        await chat.input.fill("too many")
        await chat.input.press("Enter")
        await expect(chat.notices).to_contain_text("Max new tokens")
        assert len(engine.requests) == 1


async def test_autoscroll_follows_the_reply_until_the_reader_scrolls_up(
    new_page: NewPage,
) -> None:
    script = Script([f"\nline {i}" for i in range(300)], delay_s=0.01)
    async with running_server(ScriptedEngine(in_turn(script))) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        page = chat.page
        scroller = page.locator("#scroller")
        reply = await chat.send("a long list please")
        await expect(chat.text(reply)).to_contain_text("line 60")
        assert await scroller.evaluate("s => s.scrollHeight - s.scrollTop - s.clientHeight < 48")
        await scroller.evaluate("s => { s.scrollTop = 0; }")
        await expect(chat.text(reply)).to_contain_text("line 150")
        assert await scroller.evaluate("s => s.scrollTop") == 0
        jump = page.get_by_role("button", name="Jump to latest ↓")
        await expect(jump).to_be_visible()
        assert await chat.finished(reply) == "stop"
        await jump.click()
        assert await scroller.evaluate("s => s.scrollHeight - s.scrollTop - s.clientHeight < 48")
        await expect(jump).to_be_hidden()


def _contains(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


ABOUT = "A scripted test model: it says what it is told to."


async def test_an_empty_conversation_says_what_the_model_can_do_until_it_starts(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(3)))
    engine.info = dataclasses.replace(engine.info, about=ABOUT)
    async with running_server(engine) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        about = chat.page.locator("#about")
        await expect(about).to_have_text(ABOUT)
        await expect(about).to_be_visible()
        assert await chat.finished(await chat.send("hi")) == "stop"
        await expect(about).to_be_hidden()
        await chat.page.get_by_role("button", name="New conversation").click()
        await expect(about).to_be_visible()


async def test_a_model_the_server_says_nothing_of_gets_a_plain_warning(new_page: NewPage) -> None:
    async with running_server(ScriptedEngine()) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        await expect(chat.page.locator("#about")).to_have_text(
            "Replies come from scripted, a language model: they can be wrong."
        )

"""Connection state on the chat page: tokens, a server that goes away and comes back, a model
still loading, capacity."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.async_api import expect

from tests.fakes.scripted import ScriptedEngine
from tests.proxy import cuttable_proxy
from tests.support import loading_server, running_server

from .chat import ChatPage
from .conftest import NewPage, http_base, in_turn, words

pytestmark = pytest.mark.browser

SET_TOKEN = "sessionStorage.setItem('wschat.token', {token!r})"


async def test_wrong_token_shows_the_auth_message_and_the_right_one_connects(
    new_page: NewPage,
) -> None:
    async with running_server(ScriptedEngine(), tokens=("secret",)) as url:
        page = await new_page()
        await page.add_init_script(SET_TOKEN.format(token="wrong"))
        chat = ChatPage(page, http_base(url))
        await page.goto(chat.base + "/")
        await expect(chat.conn).to_have_attribute("data-state", "auth")
        await expect(page.locator("#token-message")).to_have_text(
            "The server refused this access token."
        )
        await page.get_by_label("Token", exact=True).fill("secret")
        await page.get_by_role("button", name="Connect").click()
        await chat.connected()
        assert await page.evaluate("() => sessionStorage.getItem('wschat.token')") == "secret"
        assert await chat.finished(await chat.send("hello")) == "stop"


async def test_a_server_with_tokens_asks_for_one(new_page: NewPage) -> None:
    async with running_server(ScriptedEngine(), tokens=("secret",)) as url:
        chat = ChatPage(await new_page(), http_base(url))
        await chat.page.goto(chat.base + "/")
        await expect(chat.conn).to_have_attribute("data-state", "auth")
        await expect(chat.page.locator("#token-message")).to_have_text(
            "This server needs an access token."
        )
        await expect(chat.page.get_by_label("Token", exact=True)).to_be_focused()


async def test_killing_the_server_shows_disconnected_and_restarting_it_reconnects(
    new_page: NewPage,
) -> None:
    async with running_server(ScriptedEngine(in_turn(words(3))), shutdown_grace_s=0.5) as url:
        chat = await ChatPage(await new_page(), http_base(url)).open()
        assert await chat.finished(await chat.send("before")) == "stop"
        port = urlsplit(url).port
        assert port is not None
    await expect(chat.conn).to_have_attribute("data-state", "disconnected")
    await expect(chat.conn).to_contain_text("Disconnected")
    await expect(chat.notices).to_contain_text("Reconnecting in")
    await expect(chat.page.get_by_role("button", name="Send")).to_be_disabled()
    async with running_server(ScriptedEngine(in_turn(words(2, stem="x"))), port=port):
        await expect(chat.conn).to_have_attribute("data-state", "connected", timeout=30_000)
        # a fresh server has no memory of the old session: the page says so and goes on
        await expect(chat.page.locator("#transcript .divider")).to_contain_text("New session")
        after = await chat.send("after")
        assert await chat.finished(after) == "stop"
        await expect(chat.text(after)).to_have_text(" x0 x1")


async def test_a_loading_model_is_shown_as_such_and_the_page_connects_once_it_is_loaded(
    new_page: NewPage,
) -> None:
    async with loading_server(ScriptedEngine(in_turn(words(2)))) as (url, load):
        chat = ChatPage(await new_page(), http_base(url))
        await chat.page.goto(chat.base + "/")
        await expect(chat.conn).to_have_attribute("data-state", "loading")
        await expect(chat.conn).to_contain_text("Model loading — retrying in")
        # the third refusal in a row: the page keeps trying, on its backoff (0.5 s, 1 s, 2 s)
        await expect(chat.notices).to_have_text("The model is still loading. Reconnecting in 2 s…")
        load.release()
        await chat.connected()
        await expect(chat.notices).to_be_empty()
        reply = await chat.send("hello")
        assert await chat.finished(reply) == "stop"
        await expect(chat.text(reply)).to_have_text(" w0 w1")


async def test_a_model_that_failed_to_load_is_shown_with_the_servers_reason(
    new_page: NewPage,
) -> None:
    def fail_to_load() -> ScriptedEngine:
        raise RuntimeError("no weights here")

    async with running_server(fail_to_load) as url:
        chat = ChatPage(await new_page(), http_base(url))
        await chat.page.goto(chat.base + "/")
        await expect(chat.notices).to_contain_text(
            "The server closed the connection: the model failed to load (see the server's log)."
        )
        await expect(chat.conn).to_have_attribute("data-state", "disconnected")


async def test_a_full_server_shows_its_close_reason_and_the_page_retries(
    new_page: NewPage,
) -> None:
    async with running_server(ScriptedEngine(), max_connections=1) as url:
        first = await ChatPage(await new_page(), http_base(url)).open()
        second = ChatPage(await new_page(), http_base(url))
        await second.page.goto(second.base + "/")
        await expect(second.conn).to_have_attribute("data-state", "disconnected")
        await expect(second.notices).to_contain_text(
            "The server turned this connection away: the server is full (1 connections)."
        )
        await first.page.close()  # its place frees up: the retrying page gets it
        await second.connected()


async def test_a_connection_dropped_mid_reply_resumes_and_the_reply_is_shown_once(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(in_turn(words(200, delay_s=0.01), words(2)))
    async with running_server(engine) as url:
        port = urlsplit(url).port
        assert port is not None
        async with cuttable_proxy(port) as proxy:
            chat = await ChatPage(await new_page(), f"http://127.0.0.1:{proxy.port}").open()
            session = await chat.session()
            opened: list[str] = []
            chat.page.on("websocket", lambda ws: opened.append(ws.url))
            first = await chat.send("a long one")
            await expect(chat.text(first)).to_contain_text(" w3")
            connections = proxy.accepted
            proxy.cut()  # no close frame: a lost network
            assert await chat.finished(first) == "stop"
            await expect(chat.text(first)).to_have_text("".join(f" w{i}" for i in range(200)))
            await expect(chat.notices).to_have_text("Reconnected: the conversation was kept.")
            assert await chat.session() == session
            # PROTOCOL.md "Transport": the resume names its session, the load balancer's key
            query = parse_qs(urlsplit(opened[-1]).query)
            assert query["session"] == [session] and len(query["resume"]) == 1
            assert proxy.accepted == connections + 1  # resumed at the first try
            second = await chat.send("go on")
            assert await chat.finished(second) == "stop"
    # PROTOCOL.md section 10: the whole reply is in the conversation, not a cancelled part
    assert [i for i in engine.requests[1].prompt_ids if 1000 <= i < 1200] == list(range(1000, 1200))


async def test_a_prompt_that_must_wait_shows_its_place_then_runs(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(400, delay_s=0.02), words(2)))
    async with running_server(engine, max_concurrent=1, max_queue=1) as url:
        first = await ChatPage(await new_page(), http_base(url)).open()
        second = await ChatPage(await new_page(), http_base(url)).open()
        running = await first.send("long")
        await expect(first.text(running)).to_contain_text(" w2")
        waiting = await second.send("short")
        await expect(waiting.locator(".meta")).to_have_text("Waiting for a free slot (position 1)…")
        await first.page.get_by_role("button", name="Stop").click()
        assert await first.finished(running) == "cancelled"
        assert await second.finished(waiting) == "stop"


async def test_a_full_server_refuses_a_prompt_with_a_clear_message(new_page: NewPage) -> None:
    engine = ScriptedEngine(in_turn(words(400, delay_s=0.02)))
    async with running_server(engine, max_concurrent=1, max_queue=0) as url:
        first = await ChatPage(await new_page(), http_base(url)).open()
        second = await ChatPage(await new_page(), http_base(url)).open()
        running = await first.send("long")
        await expect(first.text(running)).to_contain_text(" w2")
        refused = await second.send("me too")
        assert await second.finished(refused) == "refused"
        await expect(refused.locator(".error-text")).to_contain_text("The server is at capacity")
        await first.page.keyboard.press("Escape")
        assert await first.finished(running) == "cancelled"

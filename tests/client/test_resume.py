"""The client resumes a dropped connection on its own (PROTOCOL.md section 10): a real server
behind a loopback TCP relay the test cuts mid-reply, as a lost network does (no close frame).
The reply goes on where it was, each piece yielded once; a close by the client is no drop. A
server restarted in place (close 1012) that keeps its sessions in a real Redis: the chat resumes
on the new process. (A drain behind HAProxy: tests/deploy/test_client_across_a_drain.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from wschat.client import Chat, ConnectionClosedError, Reply, connect

from tests.client.engines import WAIT, slow_engine
from tests.fakes.scripted import ScriptedEngine
from tests.proxy import CuttableProxy, cuttable_proxy
from tests.sessions.test_redis_replicas import redis_server
from tests.support import running_server, wait_until

WORDS = 120
LONGER = 400  # 4 s of reply: time for two cuts


def expected(n: int = WORDS) -> str:
    return "".join(f" s{i}" for i in range(n))


@pytest.fixture
async def relayed() -> AsyncIterator[tuple[str, CuttableProxy]]:
    """A server whose replies take a while, and a relay in front of it."""
    async with running_server(slow_engine(delay_s=0.01)) as url:
        port = urlsplit(url).port
        assert port is not None
        async with cuttable_proxy(port) as proxy:
            yield f"ws://127.0.0.1:{proxy.port}/v1/chat", proxy


async def pieces_until(reply: AsyncIterator[str], count: int) -> list[str]:
    got: list[str] = []
    async with asyncio.timeout(WAIT):
        while len(got) < count:
            got.append(await anext(reply))
    return got


async def cut_after(chat: Chat, proxy: CuttableProxy, count: int) -> tuple[Reply, list[str]]:
    """A reply of ``WORDS`` pieces whose connection is cut once ``count`` came."""
    reply = chat.prompt("go", max_new_tokens=WORDS)
    pieces = await pieces_until(reply, count)
    proxy.cut()
    return reply, pieces


async def test_a_reply_cut_mid_stream_goes_on_after_the_resume_each_piece_once(
    relayed: tuple[str, CuttableProxy],
) -> None:
    url, proxy = relayed
    async with connect(url, timeout=WAIT) as chat:
        session = chat.session
        reply, pieces = await cut_after(chat, proxy, 3)
        async with asyncio.timeout(WAIT):
            pieces += [piece async for piece in reply]
        assert await chat.ping() > 0  # the session goes on, on the new connection
    assert "".join(pieces) == reply.text == expected()
    assert reply.done is not None and reply.done.reason.value == "length"
    assert (chat.resumes, proxy.accepted, chat.session) == (1, 2, session)


async def test_the_resume_names_the_session_its_token_and_the_last_index_it_got(
    relayed: tuple[str, CuttableProxy],
) -> None:
    url, proxy = relayed
    async with connect(url, timeout=WAIT) as chat:
        first = chat.ready
        reply, _ = await cut_after(chat, proxy, 2)
        last = reply.last_index  # at the cut
        await reply.wait(WAIT)
    method, target, _ = proxy.requests[-1].split(" ")
    query = parse_qs(urlsplit(target).query)
    assert (method, len(proxy.requests)) == ("GET", 2)
    assert query["session"] == [first.session] and query["resume"] == [first.resume]
    assert int(query["last"][0]) >= last  # pieces the iterator had not taken yet count too
    assert chat.ready.resumed is not None and chat.ready.resumed.reply == reply.id


async def test_cut_twice_the_reply_still_comes_whole(
    relayed: tuple[str, CuttableProxy],
) -> None:
    url, proxy = relayed
    async with connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("go", max_new_tokens=LONGER)
        pieces = await pieces_until(reply, 2)
        proxy.cut()
        await wait_until(lambda: chat.resumes == 1)  # no event to await from outside the chat
        proxy.cut()
        async with asyncio.timeout(WAIT):
            pieces += [piece async for piece in reply]
    assert "".join(pieces) == expected(LONGER) and chat.resumes == 2


async def test_with_no_resume_a_cut_ends_the_reply_as_a_closed_connection(
    relayed: tuple[str, CuttableProxy],
) -> None:
    url, proxy = relayed
    chat: Chat = await connect(url, timeout=WAIT, resume_within=0)
    reply = chat.prompt("go", max_new_tokens=WORDS)
    await pieces_until(reply, 1)
    proxy.cut()
    with pytest.raises(ConnectionClosedError) as closed:
        await reply.wait(WAIT)
    assert closed.value.code == 1006 and chat.resumes == 0
    await chat.close()


async def test_a_prompt_sent_while_the_connection_is_down_goes_out_on_the_new_one(
    relayed: tuple[str, CuttableProxy],
) -> None:
    url, proxy = relayed
    async with connect(url, timeout=WAIT) as chat:
        await chat.ping()
        proxy.cut()
        reply = chat.prompt("go", max_new_tokens=5)  # queued: sent once resumed
        done = await reply.wait(WAIT)
    assert done.text == expected(5) and chat.resumes == 1


async def resumed(chat: Chat, moved: asyncio.Event, timeout: float = WAIT) -> None:
    """Until ``chat`` resumed its session (``moved``, set by ``on_resume``); fails at once
    when it ended instead."""
    ended = asyncio.ensure_future(chat.wait_closed())
    waiting = asyncio.ensure_future(moved.wait())
    try:
        await asyncio.wait({ended, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        waiting.cancel()
    assert moved.is_set(), f"the chat did not resume: {chat.closed}"


async def test_a_server_restarted_in_place_with_its_sessions_in_redis_is_resumed(
    tmp_path: Path,
) -> None:
    moved = asyncio.Event()
    async with redis_server(tmp_path) as store, contextlib.AsyncExitStack() as first:
        url = await first.enter_async_context(
            running_server(ScriptedEngine(), session_store=store.url)
        )
        chat = await connect(url, timeout=WAIT, on_resume=lambda ready: moved.set())
        assert (await chat.prompt("hello").wait(WAIT)).turn == 1
        session = chat.session
        await first.aclose()  # uvicorn closes the chat with 1012
        async with running_server(
            ScriptedEngine(), port=urlsplit(url).port or 0, session_store=store.url
        ):
            await resumed(chat, moved)
            assert (chat.session, chat.turns, chat.resumes) == (session, 1, 1)
            assert (await chat.prompt("again").wait(WAIT)).turn == 2
            await chat.close()

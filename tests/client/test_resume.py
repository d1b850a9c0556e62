"""The client resumes a dropped connection on its own (PROTOCOL.md section 10): a real server
behind a loopback TCP relay the test cuts mid-reply, as a lost network does (no close frame).
The reply goes on where it was, each piece yielded once; a close by the server, or by the
client, is no drop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import pytest
from wschat.client import Chat, ConnectionClosedError, Reply, connect

from tests.client.engines import WAIT, slow_engine
from tests.proxy import CuttableProxy, cuttable_proxy
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
        query = parse_qs(urlsplit(chat._link.ws.request.path).query)
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

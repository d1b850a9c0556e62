"""The chat route's handshake (web/app.py) against a real uvicorn: the ``wschat-session`` header
names the session the connection got, so a load balancer can learn a new session's routing key,
and ``?session=`` routes but never decides which session a connection gets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from wschat.protocol import SESSION_HEADER

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, RawPeer, running_server


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[tuple[ClientConnection, dict[str, Any]]]:
    """The socket (its handshake response) and its ``ready``."""
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, subprotocols=["wschat.v1"])
    try:
        ready = await RawPeer(ws).recv()
        assert ready["type"] == "ready"
        yield ws, ready
    finally:
        async with asyncio.timeout(TIMEOUT):
            await ws.close()


def header(ws: ClientConnection) -> str | None:
    assert ws.response is not None
    return ws.response.headers.get(SESSION_HEADER)


async def test_the_handshake_names_a_new_session_in_the_wschat_session_header() -> None:
    async with running_server(ScriptedEngine()) as url, opened(url) as (ws, ready):
        assert header(ws) == ready["session"]
        assert ws.subprotocol == "wschat.v1"


async def test_a_resumed_session_is_named_in_the_header_whatever_session_the_query_says() -> None:
    async with running_server(ScriptedEngine()) as url:
        async with opened(url) as (_, first):
            pass
        query = f"session=0123456789abcdef&resume={first['resume']}"
        async with opened(f"{url}?{query}") as (ws, ready):
            assert ready["session"] == header(ws) == first["session"]


async def test_a_session_param_without_a_valid_token_gets_a_new_session() -> None:
    async with running_server(ScriptedEngine()) as url:
        async with opened(url) as (_, first):
            pass
        for query in (f"session={first['session']}", f"session={first['session']}&resume=nope"):
            async with opened(f"{url}?{query}") as (ws, ready):
                assert ready["session"] == header(ws) != first["session"]

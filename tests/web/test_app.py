"""The chat route's handshake (web/app.py) against a real uvicorn: the ``wschat-session`` header
names the session the connection got, so a load balancer can learn a new session's routing key,
and ``?session=`` routes but never decides which session a connection gets. A WebSocket handshake
on any other path is answered HTTP 404 naming the chat endpoint."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus
from wschat.protocol import SESSION_HEADER

from tests.fakes.scripted import ScriptedEngine
from tests.support import SUBPROTOCOL, TIMEOUT, RawPeer, http_base, running_server

NO_CHAT_HERE = b"no chat endpoint at this path; the chat endpoint is /v1/chat\n"


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[tuple[ClientConnection, dict[str, Any]]]:
    """The socket (its handshake response) and its ``ready``."""
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(url, subprotocols=[SUBPROTOCOL])
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


@pytest.mark.parametrize("path", ["/chat", "/", "/v1/chat/", "/v1/stats/x", "/static/app.js"])
async def test_a_websocket_handshake_on_an_unknown_path_gets_404_naming_the_chat_endpoint(
    path: str,
) -> None:
    async with running_server(ScriptedEngine()) as url:
        with pytest.raises(InvalidStatus) as refused:
            async with asyncio.timeout(TIMEOUT):
                await websockets.connect(url.removesuffix("/v1/chat") + path)
        async with opened(url) as (_, ready):  # the chat endpoint itself still serves
            assert ready["type"] == "ready"
    response = refused.value.response
    assert (response.status_code, response.body) == (404, NO_CHAT_HERE)
    assert response.headers["Content-Type"].startswith("text/plain")


async def test_a_plain_http_request_on_an_unknown_path_is_still_the_usual_404() -> None:
    async with (
        running_server(ScriptedEngine()) as url,
        httpx.AsyncClient(timeout=TIMEOUT) as http,
    ):
        response = await http.get(http_base(url) + "/chat")
    assert (response.status_code, response.text) == (404, "Not Found")

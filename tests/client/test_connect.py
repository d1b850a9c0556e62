"""Opening and losing the connection: refused handshakes, credentials, drops mid-reply."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from wschat.client import Chat, ConnectError, ConnectionClosedError, connect
from wschat.protocol import Capabilities, Limits, Ready, encode
from wschat.server.engine.scripted import ScriptedEngine

from tests.client.engines import WAIT, slow_engine
from tests.support import running_server


async def test_connection_lost_mid_reply_raises_connection_closed() -> None:
    async with running_server(slow_engine()) as url:
        chat = await connect(url, timeout=WAIT)
        reply = chat.prompt("go")
        async with asyncio.timeout(WAIT):
            await anext(reply)
    # the server has stopped: its close reached the client while the reply was streaming
    with pytest.raises(ConnectionClosedError) as closed:
        await reply.wait(WAIT)
    assert reply.done is None and closed.value.code not in (None, 1000)
    assert chat.closed is closed.value
    with pytest.raises(ConnectionClosedError):
        chat.prompt("anyone?")
    with pytest.raises(ConnectionClosedError):
        await chat.ping()
    await chat.close()


async def test_closing_the_chat_ends_its_running_reply() -> None:
    async with running_server(slow_engine()) as url:
        async with connect(url, timeout=WAIT) as chat:
            reply = chat.prompt("go")
            async with asyncio.timeout(WAIT):
                await anext(reply)
        with pytest.raises(ConnectionClosedError) as closed:
            await reply.wait(WAIT)
        assert closed.value.code == 1000


async def test_server_still_loading_closes_with_try_again_later() -> None:
    release = threading.Event()

    def load_forever() -> ScriptedEngine:
        release.wait(WAIT)
        return ScriptedEngine()

    try:
        async with running_server(load_forever) as url:  # type: ignore[arg-type]
            with pytest.raises(ConnectError) as refused:
                await connect(url, timeout=WAIT)
            assert (refused.value.status, refused.value.close_code) == (None, 1013)
            assert "the model is still loading" in refused.value.message
    finally:
        release.set()


async def test_nothing_listening_raises_connect_error_without_status() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectError) as failed:
        await connect(f"ws://127.0.0.1:{port}/v1/chat", timeout=WAIT)
    assert failed.value.status is None
    assert failed.value.message.startswith(f"cannot connect to ws://127.0.0.1:{port}/v1/chat")


async def test_not_a_websocket_url_raises_connect_error() -> None:
    with pytest.raises(ConnectError) as failed:
        await connect("http://127.0.0.1:1/v1/chat", timeout=WAIT)
    assert failed.value.message == "not a WebSocket URL: 'http://127.0.0.1:1/v1/chat'"


READY = Ready(
    v=1,
    session="s1",
    resume="r1",
    model="stub",
    capabilities=Capabilities(images=False, max_images=0),
    limits=Limits(
        max_frame_bytes=1 << 20,
        max_image_bytes=1 << 20,
        context_tokens=128,
        max_new_tokens=16,
        max_image_pixels=1 << 20,
    ),
)


@contextlib.asynccontextmanager
async def token_checking_server(token: str) -> AsyncIterator[tuple[str, list[list[str]]]]:
    """A WebSocket server that wants ``bearer.TOKEN`` among the offered subprotocols (as
    PROTOCOL.md "Authentication" allows) and answers HTTP 401 otherwise; records the offers."""
    offers: list[list[str]] = []

    def check(connection: ServerConnection, request: Request) -> Response | None:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        offers.append(offered)
        if f"bearer.{token}" in offered:
            return None
        return Response(401, "Unauthorized", Headers(), b"")

    async def handler(connection: ServerConnection) -> None:
        await connection.send(encode(READY))
        await connection.wait_closed()

    async with serve(
        handler, "127.0.0.1", 0, process_request=check, subprotocols=["wschat.v1"]
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/chat", offers


async def test_token_is_offered_as_a_bearer_subprotocol() -> None:
    async with token_checking_server("s3cret") as (url, offers):
        async with connect(url, token="s3cret", timeout=WAIT) as chat:
            assert isinstance(chat, Chat) and chat.session == "s1"
        assert offers == [["wschat.v1", "bearer.s3cret"]]


async def test_missing_or_wrong_token_raises_connect_error_401() -> None:
    async with token_checking_server("s3cret") as (url, offers):
        for token in (None, "wrong"):
            with pytest.raises(ConnectError) as refused:
                await connect(url, token=token, timeout=WAIT)
            assert refused.value.status == 401
        assert offers == [["wschat.v1"], ["wschat.v1", "bearer.wrong"]]

"""Opening and losing the connection: refused handshakes, credentials, drops mid-reply."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from wschat.client import (
    Chat,
    ConnectError,
    ConnectionClosedError,
    ModelLoadingError,
    NoChatEndpointError,
    NotListeningError,
    NotServingYetError,
    connect,
)
from wschat.client.opening import retry_delays
from wschat.protocol import MODEL_LOADING_REASON, Capabilities, Limits, Ready, encode
from wschat.server.web.admission import MODEL_FAILED_REASON

from tests.client.engines import WAIT, slow_engine
from tests.fakes.scripted import ScriptedEngine
from tests.proxy import cuttable_proxy
from tests.support import SUBPROTOCOL, free_port, loading_server, running_server, wait_until

W8 = "".join(f" w{i}" for i in range(8))  # the default scripted reply


async def test_connection_lost_mid_reply_raises_connection_closed() -> None:
    async with running_server(slow_engine()) as url:
        chat = await connect(url, timeout=WAIT, resume_within=1)
        reply = chat.prompt("go")
        async with asyncio.timeout(WAIT):
            await anext(reply)
    # the server has stopped: its close (uvicorn's 1012, a restart) reached the client while the
    # reply was streaming, and for a second nothing listened where it was
    with pytest.raises(ConnectionClosedError) as closed:
        await reply.wait(WAIT)
    assert reply.done is None and closed.value.code == 1012
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


async def test_server_still_loading_raises_model_loading_error_at_once_by_default() -> None:
    async with loading_server(ScriptedEngine()) as (url, _):
        with pytest.raises(ModelLoadingError) as refused:
            await connect(url, timeout=WAIT)
    error = refused.value
    assert (error.status, error.close_code, error.close_reason) == (
        None,
        1013,
        MODEL_LOADING_REASON,
    )
    assert (
        error.message == "the server closed the connection (code 1013): the model is still loading"
    )


async def test_connect_waits_for_a_loading_model_then_opens() -> None:
    told: list[None] = []
    async with loading_server(ScriptedEngine()) as (url, load):
        port = urlsplit(url).port
        assert port is not None
        async with cuttable_proxy(port) as proxy:
            opening = asyncio.ensure_future(
                connect(
                    f"ws://127.0.0.1:{proxy.port}/v1/chat",
                    timeout=WAIT,
                    load_wait=WAIT,
                    on_loading=lambda: told.append(None),
                )
            )
            await wait_until(lambda: proxy.accepted >= 3)  # refused twice or more, still trying
            assert not opening.done()
            load.release()
            async with asyncio.timeout(WAIT):
                chat = await opening
            async with chat:
                done = await chat.prompt("hi").wait(WAIT)
    assert done.text == W8
    assert told == [None]  # once, however many tries


async def test_connect_gives_up_on_a_model_still_loading_after_load_wait() -> None:
    told: list[None] = []
    async with loading_server(ScriptedEngine()) as (url, _):
        with pytest.raises(ModelLoadingError) as refused:
            await connect(url, timeout=WAIT, load_wait=0.3, on_loading=lambda: told.append(None))
    assert refused.value.message == "the model was still loading after waiting 0.3 s"
    assert (refused.value.close_code, told) == (1013, [None])


async def test_connect_does_not_wait_for_a_full_server() -> None:
    told: list[None] = []
    async with (
        running_server(ScriptedEngine(), max_connections=1) as url,
        connect(url, timeout=WAIT),
    ):
        with pytest.raises(ConnectError) as refused:
            await connect(url, timeout=WAIT, load_wait=WAIT, on_loading=lambda: told.append(None))
    assert type(refused.value) is ConnectError and told == []
    assert (refused.value.close_code, refused.value.close_reason) == (
        1013,
        "the server is full (1 connections)",
    )


async def test_connect_stops_waiting_once_the_model_failed_to_load() -> None:
    def fail_to_load() -> ScriptedEngine:
        raise RuntimeError("no weights here")

    async with running_server(fail_to_load) as url:
        with pytest.raises(ConnectError) as refused:
            await connect(url, timeout=WAIT, load_wait=WAIT)  # a refusal as loading, at most
    assert type(refused.value) is ConnectError
    assert (refused.value.close_code, refused.value.close_reason) == (1011, MODEL_FAILED_REASON)


def test_retry_delays_double_from_a_quarter_second_up_to_two() -> None:
    assert list(itertools.islice(retry_delays(), 6)) == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]


# -- a server not listening yet ----------------------------------------------------------------


class Waits:
    """``connect``'s ``on_waiting``: records each error a wait began or changed on; ``began`` is
    set on the first."""

    def __init__(self) -> None:
        self.errors: list[NotServingYetError] = []
        self.began = asyncio.Event()

    def __call__(self, error: NotServingYetError) -> None:
        self.errors.append(error)
        self.began.set()

    async def first(self) -> NotServingYetError:
        async with asyncio.timeout(WAIT):
            await self.began.wait()
        return self.errors[0]


async def test_nothing_listening_raises_not_listening_at_once_by_default() -> None:
    url = f"ws://127.0.0.1:{free_port()}/v1/chat"
    waits = Waits()
    with pytest.raises(NotListeningError) as failed:
        await connect(url, timeout=WAIT, on_waiting=waits)
    assert failed.value.status is None and waits.errors == []
    assert failed.value.message == f"cannot connect to {url}: nothing is listening there"


async def test_connect_waits_for_a_server_not_listening_yet_then_opens() -> None:
    port = free_port()
    waits, loading = Waits(), list[None]()
    opening = asyncio.ensure_future(
        connect(
            f"ws://127.0.0.1:{port}/v1/chat",
            timeout=WAIT,
            load_wait=WAIT,
            on_waiting=waits,
            on_loading=lambda: loading.append(None),
        )
    )
    try:
        assert isinstance(await waits.first(), NotListeningError)
        assert not opening.done()
        async with running_server(ScriptedEngine(), port=port):  # starts while the client waits
            async with asyncio.timeout(WAIT):
                chat = await opening
            async with chat:
                done = await chat.prompt("hi").wait(WAIT)
    finally:
        opening.cancel()
    assert done.text == W8
    assert [type(e) for e in waits.errors] == [NotListeningError] and loading == []


async def test_connect_waits_through_not_listening_then_loading_saying_each_once() -> None:
    port = free_port()
    waits = Waits()
    opening = asyncio.ensure_future(
        connect(f"ws://127.0.0.1:{port}/v1/chat", timeout=WAIT, load_wait=WAIT, on_waiting=waits)
    )
    try:
        await waits.first()
        async with loading_server(ScriptedEngine(), port=port) as (_, load):
            await wait_until(lambda: len(waits.errors) == 2)
            load.release()
            async with asyncio.timeout(WAIT):
                chat = await opening
            await chat.close()
    finally:
        opening.cancel()
    assert [type(e) for e in waits.errors] == [NotListeningError, ModelLoadingError]


async def test_connect_gives_up_on_a_server_not_listening_after_load_wait() -> None:
    url = f"ws://127.0.0.1:{free_port()}/v1/chat"
    waits = Waits()
    with pytest.raises(NotListeningError) as failed:
        await connect(url, timeout=WAIT, load_wait=0.3, on_waiting=waits)
    assert failed.value.message == (
        f"cannot connect to {url}: nothing is listening there, still after waiting 0.3 s"
    )
    assert len(waits.errors) == 1


@contextlib.asynccontextmanager
async def dropping_server() -> AsyncIterator[str]:
    """A TCP server that resets every connection as soon as its handshake request arrives."""

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.transport.abort()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat"
    finally:
        server.close()


async def test_a_connection_dropped_during_the_handshake_is_waited_out_like_no_listener() -> None:
    waits = Waits()
    async with dropping_server() as url:
        with pytest.raises(NotListeningError) as failed:
            await connect(url, timeout=WAIT, load_wait=0.3, on_waiting=waits)
    assert failed.value.message.startswith(f"cannot connect to {url}: the server ")
    assert failed.value.message.endswith(", still after waiting 0.3 s")
    assert [type(e) for e in waits.errors] == [NotListeningError]


async def test_a_proxy_answering_503_while_its_server_starts_is_waited_out() -> None:
    waits = Waits()

    def unavailable_until_waited(connection: ServerConnection, request: Request) -> Response | None:
        return None if waits.errors else Response(503, "Service Unavailable", Headers(), b"")

    async def handler(connection: ServerConnection) -> None:
        await connection.send(encode(READY))
        await connection.wait_closed()

    async with serve(handler, "127.0.0.1", 0, process_request=unavailable_until_waited) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(
            f"ws://127.0.0.1:{port}/v1/chat", timeout=WAIT, load_wait=WAIT, on_waiting=waits
        ) as chat:
            assert chat.session == "s1"
    (error,) = waits.errors
    assert (type(error), error.status) == (NotListeningError, 503)


async def test_an_unknown_host_name_is_not_waited_for() -> None:
    waits = Waits()
    with pytest.raises(ConnectError) as failed:
        await connect(
            "ws://no-such-host.invalid/v1/chat", timeout=WAIT, load_wait=WAIT, on_waiting=waits
        )
    assert not isinstance(failed.value, NotServingYetError) and waits.errors == []
    assert failed.value.message.startswith("cannot connect to ws://no-such-host.invalid/v1/chat: ")


async def test_a_tls_failure_is_not_waited_for() -> None:
    waits = Waits()
    async with running_server(ScriptedEngine()) as url:  # plain ws: no TLS to shake hands with
        with pytest.raises(ConnectError) as failed:
            await connect(
                url.replace("ws://", "wss://"), timeout=WAIT, load_wait=WAIT, on_waiting=waits
            )
    assert not isinstance(failed.value, NotServingYetError) and waits.errors == []


# -- a URL that names no chat endpoint ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "hint"), [("", True), ("/", True), ("/chat", False), ("/v1/chat/", False)]
)
async def test_a_url_without_the_chat_path_raises_no_chat_endpoint_naming_it(
    path: str, hint: bool
) -> None:
    waits = Waits()
    async with running_server(ScriptedEngine()) as url:
        base = url.removesuffix("/v1/chat")
        with pytest.raises(NoChatEndpointError) as failed:
            await connect(base + path, timeout=WAIT, load_wait=WAIT, on_waiting=waits)
    expected = f"no chat endpoint at {base + path}; the chat endpoint is /v1/chat"
    if hint:
        expected += f" (try {base}/v1/chat)"
    assert (failed.value.message, failed.value.status, waits.errors) == (expected, 404, [])


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
        handler, "127.0.0.1", 0, process_request=check, subprotocols=[SUBPROTOCOL]
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


@contextlib.asynccontextmanager
async def path_recording_server() -> AsyncIterator[tuple[str, list[str]]]:
    """A WebSocket server that sends ``READY`` and records each handshake's path and query."""
    paths: list[str] = []

    def record(connection: ServerConnection, request: Request) -> None:
        paths.append(request.path)

    async def handler(connection: ServerConnection) -> None:
        await connection.send(encode(READY))
        await connection.wait_closed()

    async with serve(handler, "127.0.0.1", 0, process_request=record) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/chat?lang=en", paths


async def test_a_resume_names_its_session_as_the_routing_key_beside_the_token() -> None:
    async with path_recording_server() as (url, paths):
        async with connect(url, timeout=WAIT):
            pass
        async with connect(url, timeout=WAIT, resume="r1", session="s1"):
            pass
        async with connect(url, timeout=WAIT, resume="r1"):
            pass
    assert paths == [
        "/v1/chat?lang=en",
        "/v1/chat?lang=en&resume=r1&session=s1",
        "/v1/chat?lang=en&resume=r1",
    ]

"""HTTP request bodies that stall or pin memory (runtime/http_protocol.py, openai_api/in_flight.py):
a body must come whole within ``--body-timeout-s`` of its head (else 408 in OpenAI's error
shape, and the connection closed), an API request holds a place in the connection caps while
it runs (past them: 429 before its body is read), and bodies from one address pin no more
memory than those caps allow."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.api.support import user
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import (
    TIMEOUT,
    http_base,
    running_server,
    server_process,
    tcp_queues,
    wait_until,
)

BODY_TIMEOUT_S = 1.0
CHAT = "/v1/chat/completions"
LONG = 1000  # max_tokens that asks the scripted engine for a reply slower than any test
MIB = 1024 * 1024


def slow_when_long(request: Any) -> Script:
    n = request.params.max_new_tokens
    if n >= LONG:
        return Script([f" w{i}" for i in range(n)], delay_s=0.2)
    return Script([f" w{i}" for i in range(4)])


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def post_head(port: int, length: int, path: str = CHAT) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


@contextlib.asynccontextmanager
async def raw_connection(
    port: int, local: str = "127.0.0.1"
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    try:
        yield reader, writer
    finally:
        writer.close()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    async with asyncio.timeout(TIMEOUT):
        while chunk := await reader.read(65536):
            received += chunk
    return received


def status_and_json(response: bytes) -> tuple[str, dict[str, Any]]:
    head, _, body = response.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


TIMED_OUT = {
    "error": {
        "message": f"the request body did not arrive whole within {BODY_TIMEOUT_S:g} s",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_timeout",
    }
}


async def test_a_stalled_body_is_answered_408_and_closed_after_the_body_timeout() -> None:
    async with running_server(ScriptedEngine(), body_timeout_s=BODY_TIMEOUT_S) as url:
        port = port_of(url)
        async with raw_connection(port) as (reader, writer):
            writer.write(post_head(port, 1000) + b'{"model": "m", ')
            started = asyncio.get_running_loop().time()
            response = await until_closed(reader)
            waited = asyncio.get_running_loop().time() - started
    assert status_and_json(response) == ("HTTP/1.1 408 Request Timeout", TIMED_OUT)
    assert waited >= BODY_TIMEOUT_S * 0.9  # the body had its time (timers may fire a bit early)


async def test_a_trickling_body_is_answered_408_at_the_body_timeout() -> None:
    async with running_server(ScriptedEngine(), body_timeout_s=BODY_TIMEOUT_S) as url:
        port = port_of(url)
        async with raw_connection(port) as (reader, writer):
            writer.write(post_head(port, 1000) + b"{")

            async def trickle() -> None:
                with contextlib.suppress(ConnectionError):
                    while not writer.is_closing():
                        writer.write(b" ")  # a byte every 0.1 s: data keeps coming, never all
                        await writer.drain()
                        await asyncio.sleep(0.1)

            trickling = asyncio.create_task(trickle())
            response = await until_closed(reader)
            trickling.cancel()
            await asyncio.gather(trickling, return_exceptions=True)
    assert status_and_json(response) == ("HTTP/1.1 408 Request Timeout", TIMED_OUT)


async def test_a_body_on_a_kept_alive_connection_has_the_same_deadline() -> None:
    async with running_server(ScriptedEngine(), body_timeout_s=BODY_TIMEOUT_S) as url:
        port = port_of(url)
        async with raw_connection(port) as (reader, writer):
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            async with asyncio.timeout(TIMEOUT):
                first = await reader.readuntil(b"ok\n")
            writer.write(post_head(port, 1000) + b"{")
            response = await until_closed(reader)
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert status_and_json(response) == ("HTTP/1.1 408 Request Timeout", TIMED_OUT)


async def test_a_request_past_its_address_cap_is_429_while_another_address_is_served() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with running_server(engine, max_connections_per_client=2) as url:
        endpoint = f"{http_base(url)}{CHAT}"
        long = {"model": "m", "messages": [user("Hi")], "max_tokens": LONG, "stream": True}
        short = {"model": "m", "messages": [user("Hi")]}
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with (
            httpx.AsyncClient(timeout=TIMEOUT) as http,
            httpx.AsyncClient(timeout=TIMEOUT, transport=other) as elsewhere,
            contextlib.AsyncExitStack() as streams,
        ):
            for _ in range(2):  # two replies streaming: both places of 127.0.0.1 taken
                stream = await streams.enter_async_context(http.stream("POST", endpoint, json=long))
                assert stream.status_code == 200
            refused = await http.post(endpoint, json=short)
            served = await elsewhere.post(endpoint, json=short)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json() == {
        "error": {
            "message": "too many connections from this address (2): an API request counts as"
            " a connection until it is answered",
            "type": "rate_limit_error",
            "param": None,
            "code": "overloaded",
        }
    }
    assert served.status_code == 200
    assert served.json()["choices"][0]["message"]["content"] == " w0 w1 w2 w3"


async def test_stalled_bodies_from_one_address_pin_no_more_memory_than_its_cap(
    tmp_path: Path,
) -> None:
    """The issue's scenario scaled down: 12 connections send a head and a body one byte short
    of 12 MiB, then nothing; 4 requests in flight are allowed from the address. All 12 bodies
    held (the server before the caps counted API requests) is 144 MiB; the cap's 4, 48 MiB."""
    options = ("--max-connections-per-client", "4", "--body-timeout-s", "60")
    async with (
        server_process(tmp_path / "server.log", *options) as (proc, url),
        contextlib.AsyncExitStack() as stack,
    ):
        port = port_of(url)
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:  # what a first request loads
            warm = {"model": "m", "messages": [user("Hi")]}
            assert (await http.post(f"{http_base(url)}{CHAT}", json=warm)).status_code == 200
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        body = b" " * (12 * MIB - 1)
        connections = []
        for batch in (4, 8):  # the first 4 in flight before the other 8 come
            opened = [await stack.enter_async_context(raw_connection(port)) for _ in range(batch)]
            for _, writer in opened:
                writer.write(post_head(port, 12 * MIB) + body)
            await wait_until(functools.partial(all_read, port, opened), timeout=2 * TIMEOUT)
            connections += opened
        grown = (server.memory_info().rss - before) / MIB
        print(f"12 stalled 12 MiB bodies, 4 in flight allowed: server RSS +{grown:.0f} MiB")
        assert grown < 80
        refused = []
        for reader, _ in connections[4:]:
            async with asyncio.timeout(TIMEOUT):
                refused.append((await reader.readuntil(b"\r\n")).decode().strip())
    assert refused == ["HTTP/1.1 429 Too Many Requests"] * 8


def all_read(
    port: int, connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
) -> bool:
    """Every byte written on ``connections`` is in the server's hands."""
    theirs = ("127.0.0.1", port)
    for _, writer in connections:
        mine = writer.get_extra_info("sockname")
        if writer.transport.get_write_buffer_size() or tcp_queues(mine, theirs)[0]:
            return False
        if tcp_queues(theirs, mine)[1]:
            return False
    return True

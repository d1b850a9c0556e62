"""Slowloris: HTTP requests that never finish are dropped after ``--handshake-timeout-s``, at
most ``--max-pending-handshakes`` (and ``--max-connections-per-client`` from one address) wait
at once, and running out of file descriptors is logged a line at a time instead of a traceback
per refused accept."""

from __future__ import annotations

import asyncio
import resource
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import psutil

from tests.support import TIMEOUT, raw_peer, server_process

PARTIAL_REQUEST = b"GET /v1/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
TIMEOUT_S = 1.0
# how long a test waits for each partial request to be dropped: far past TIMEOUT_S, and short
# of the 60 s timeout of the tests about caps
DROPPED_WITHIN_S = 10.0


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


async def dropped(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True once the server closed the connection, False if it still holds it after ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            return await reader.read() == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def partial_requests(
    url: str, count: int, stack: AsyncExitStack, within_s: float = DROPPED_WITHIN_S
) -> list[bool]:
    """Open ``count`` connections that send the start of a handshake and never end it; for each,
    whether the server dropped it within ``within_s``."""
    streams = []
    for _ in range(count):
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(url))
        stack.callback(writer.close)  # holds the writer too: one collected unclosed warns
        writer.write(PARTIAL_REQUEST)
        streams.append((reader, writer))
    return list(await asyncio.gather(*(dropped(reader, within_s) for reader, _ in streams)))


async def test_partial_requests_are_dropped_after_the_handshake_timeout(tmp_path: Path) -> None:
    options = ("--handshake-timeout-s", str(TIMEOUT_S))
    async with (
        server_process(tmp_path / "server.log", *options) as (proc, url),
        AsyncExitStack() as stack,
    ):
        server = psutil.Process(proc.pid)
        fds_before = server.num_fds()
        results = await partial_requests(url, 50, stack)
        held = server.num_fds() - fds_before
        print(f"slowloris: {results.count(False)} of 50 partial requests held; {held} fds held")
        async with raw_peer(url) as (peer, _):  # a whole handshake is not cut
            await peer.send({"type": "ping", "t": 1.0})
            assert (await peer.recv())["type"] == "pong"
    assert results.count(True) == 50
    assert held <= 0


async def test_pending_handshakes_over_the_cap_are_dropped_at_once(tmp_path: Path) -> None:
    options = ("--handshake-timeout-s", "60", "--max-pending-handshakes", "10")
    async with (
        server_process(tmp_path / "server.log", *options) as (_, url),
        AsyncExitStack() as stack,
    ):
        results = await partial_requests(url, 30, stack)
    print(f"pending handshakes: {results.count(False)} of 30 held with a cap of 10")
    assert results.count(False) == 10


async def test_one_address_cannot_take_every_pending_handshake(tmp_path: Path) -> None:
    options = ("--handshake-timeout-s", "60", "--max-connections-per-client", "10")
    async with (
        server_process(tmp_path / "server.log", *options) as (_, url),
        AsyncExitStack() as stack,
    ):
        results = await partial_requests(url, 30, stack)
        async with raw_peer(url, local_addr=("127.0.0.2", 0)) as (peer, _):
            await peer.send({"type": "ping", "t": 1.0})
            assert (await peer.recv())["type"] == "pong"
    assert results.count(False) == 10


def few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


async def test_running_out_of_descriptors_logs_a_few_lines_and_recovers(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    options = ("--handshake-timeout-s", str(TIMEOUT_S), "--max-pending-handshakes", "1000")
    async with (
        server_process(log, *options, preexec_fn=few_descriptors) as (_, url),
        AsyncExitStack() as stack,
    ):
        logged_before = log.stat().st_size
        # 100 connections with 64 descriptors: they get in a batch at a time, as others time out
        results = await partial_requests(url, 100, stack, within_s=3 * DROPPED_WITHIN_S)
        async with asyncio.timeout(TIMEOUT), httpx.AsyncClient() as http:
            health = await http.get(f"http://127.0.0.1:{port_of(url)}/healthz")
        logged = log.stat().st_size - logged_before
    print(f"descriptors exhausted: {logged} bytes logged; {results.count(False)} of 100 held")
    assert results.count(True) == 100
    assert health.status_code == 200
    assert logged < 4096, log.read_text()[-4096:]

"""Slowloris: HTTP requests that never finish are dropped after ``--handshake-timeout-s``, at
most ``--max-pending-handshakes`` wait at once, addresses that fill them cannot keep another
address out (a newcomer takes the oldest place of the address holding the most), and running
out of file descriptors is logged a line at a time instead of a traceback per refused accept."""

from __future__ import annotations

import asyncio
import resource
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import psutil

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, raw_peer, running_server, server_process

PARTIAL_REQUEST = b"GET /v1/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
TIMEOUT_S = 1.0
# how long a test waits for each partial request to be dropped: far past TIMEOUT_S, and short
# of the 60 s timeout of the tests about caps
DROPPED_WITHIN_S = 10.0
# how long a connection that is not to be dropped is watched
HELD_FOR_S = 1.0


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


async def open_partial_requests(
    url: str, count: int, stack: AsyncExitStack, local: str = "127.0.0.1"
) -> list[asyncio.StreamReader]:
    """Open ``count`` connections from ``local`` that send the start of a handshake and never
    end it."""
    readers = []
    for _ in range(count):
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port_of(url), local_addr=(local, 0)
            )
        stack.callback(writer.close)  # holds the writer too: one collected unclosed warns
        writer.write(PARTIAL_REQUEST)
        readers.append(reader)
    return readers


async def partial_requests(
    url: str, count: int, stack: AsyncExitStack, within_s: float = DROPPED_WITHIN_S
) -> list[bool]:
    """Open ``count`` partial requests; for each, whether the server dropped it within
    ``within_s``."""
    readers = await open_partial_requests(url, count, stack)
    return await held_or_dropped(readers, within_s)


async def held_or_dropped(readers: list[asyncio.StreamReader], within_s: float) -> list[bool]:
    return list(await asyncio.gather(*(dropped(reader, within_s) for reader in readers)))


async def healthz(url: str, local: str) -> int:
    transport = httpx.AsyncHTTPTransport(local_address=local)
    async with asyncio.timeout(TIMEOUT), httpx.AsyncClient(transport=transport) as http:
        return (await http.get(f"http://127.0.0.1:{port_of(url)}/healthz")).status_code


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


async def test_a_newcomer_takes_the_oldest_pending_place_of_the_address_holding_the_most(
    tmp_path: Path,
) -> None:
    options = ("--handshake-timeout-s", "60", "--max-pending-handshakes", "10")
    async with (
        server_process(tmp_path / "server.log", *options) as (_, url),
        AsyncExitStack() as stack,
    ):
        readers = await open_partial_requests(url, 10, stack)  # every place, one address
        status = await healthz(url, local="127.0.0.2")
        oldest_dropped = await dropped(readers[0], TIMEOUT)
        others = await held_or_dropped(readers[1:], HELD_FOR_S)
    assert status == 200
    assert oldest_dropped
    assert others == [False] * 9


async def test_addresses_holding_silent_connections_keep_no_other_from_health_or_chat(
    tmp_path: Path,
) -> None:
    """The issue's lockout scaled down: 3 addresses keep 12 silent connections each against 24
    places, shares of 4. Before, the first two took every place and a fourth address got
    neither ``/healthz`` nor a chat."""
    options = (
        "--handshake-timeout-s", "60",
        "--max-pending-handshakes", "24",
        "--max-pending-handshakes-per-client", "4",
    )  # fmt: skip
    async with (
        server_process(tmp_path / "server.log", *options) as (_, url),
        AsyncExitStack() as stack,
    ):
        silent = [
            await open_partial_requests(url, 12, stack, local=f"127.0.0.{n}") for n in (2, 3, 4)
        ]
        status = await healthz(url, local="127.0.0.5")
        async with raw_peer(url, local_addr=("127.0.0.5", 0)) as (peer, _):
            await peer.send({"type": "ping", "t": 1.0})
            pong = await peer.recv()
        held = [(await held_or_dropped(readers, HELD_FOR_S)).count(False) for readers in silent]
    assert status == 200
    assert pong["type"] == "pong"
    # the third address took its share from the two holding the most, oldest first, and the
    # health check one more place from the first (chat came when a place was free)
    assert held == [9, 10, 4]


async def test_a_burst_of_connections_from_one_address_is_not_cut_by_its_share() -> None:
    # places are taken before a connection has sent a byte: a client opening many at once (an
    # SDK's requests gathered) must not be cut by its share while places are free
    async with (
        running_server(ScriptedEngine(), max_pending_handshakes_per_client=2) as url,
        AsyncExitStack() as stack,
    ):
        opened = await asyncio.gather(
            *(stack.enter_async_context(raw_peer(url)) for _ in range(30))
        )
        for peer, _ in opened:
            await peer.send({"type": "ping", "t": 1.0})
            assert (await peer.recv())["type"] == "pong"
    assert [ready["type"] for _, ready in opened] == ["ready"] * 30


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

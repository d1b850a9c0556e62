"""``/v1/stats`` sockets: they count toward the connection caps, all subscribers share one
snapshot a second, and a shutdown closes them with 1001."""

from __future__ import annotations

import asyncio
import math
import signal
import time
from contextlib import AsyncExitStack
from pathlib import Path

import psutil
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from wschat.protocol import Stats

from tests.fakes.scripted import ScriptedEngine
from tests.support import (
    TIMEOUT,
    closed_before_ready,
    next_stats,
    running_server,
    server_process,
    stats_socket,
)

SUBSCRIBERS = 200
ROUNDS = 3


async def next_rounds(ws: ClientConnection) -> list[Stats]:
    return [await next_stats(ws) for _ in range(ROUNDS)]


async def test_stats_sockets_count_toward_the_connection_caps() -> None:
    async with (
        running_server(ScriptedEngine(), max_connections_per_client=2) as url,
        stats_socket(url) as first,
        stats_socket(url) as second,
    ):
        await next_stats(first)
        await next_stats(second)
        async with stats_socket(url) as third:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await next_stats(third)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1013,
            "too many connections from this address (2)",
        )
        code, _ = await closed_before_ready(url)  # a chat connection counts the same places
        assert code == 1013


async def test_stats_subscribers_share_one_snapshot_a_second(tmp_path: Path) -> None:
    options = ("--max-connections-per-client", str(SUBSCRIBERS))
    async with (
        server_process(tmp_path / "server.log", *options) as (proc, url),
        AsyncExitStack() as stack,
    ):
        server = psutil.Process(proc.pid)
        cpu_before = server.cpu_times()
        started = time.monotonic()
        sockets = [await stack.enter_async_context(stats_socket(url)) for _ in range(SUBSCRIBERS)]
        rounds = await asyncio.gather(*(next_rounds(ws) for ws in sockets))
        spanned_s = time.monotonic() - started
        cpu = server.cpu_times()
        used_s = cpu.user + cpu.system - cpu_before.user - cpu_before.system
    snapshots = {frame.uptime_s for frames in rounds for frame in frames}
    print(
        f"stats: {SUBSCRIBERS} subscribers, {ROUNDS} frames each: {len(snapshots)} distinct"
        f" snapshots in {spanned_s:.1f} s; server CPU {used_s:.2f} s"
    )
    # one snapshot a second for all subscribers, whenever each joined
    assert len(snapshots) <= math.ceil(spanned_s) + 1


async def test_stats_sockets_close_1001_on_shutdown(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    async with server_process(log) as (proc, url), stats_socket(url) as ws:
        await next_stats(ws)
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await next_stats(ws)
        async with asyncio.timeout(TIMEOUT):
            returncode = await asyncio.to_thread(proc.wait)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1001
    assert returncode == 0, log.read_text()

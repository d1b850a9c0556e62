"""A WebSocket ping flood from a client that never reads: control frames count toward the frame
rate, so the flood is closed before its pongs can pile up in the server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest
import websockets

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT, ZombiePeer, raw_peer, running_server, server_process, zombie_peer

PINGS = 100_000  # 125-byte payloads: 13 MB on the wire, as much in pongs if all were answered
BATCH = 1000
RSS_BOUND = 4 * 2**20


async def flood_with_pings(zombie: ZombiePeer) -> int:
    """Pings as fast as the socket takes them until ``PINGS`` or the server hangs up; how many."""
    sent = 0
    try:
        while sent < PINGS:
            for _ in range(BATCH):
                zombie.ws.send_ping(b"p" * 125)
            zombie.writer.write(b"".join(zombie.ws.data_to_send()))
            await zombie.writer.drain()
            sent += BATCH
    except ConnectionError:
        pass
    return sent


async def test_a_ping_flood_is_closed_1008_before_its_pongs_pile_up(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    async with (
        server_process(log, "--frames-per-second", "50") as (proc, url),
        zombie_peer(url) as zombie,
    ):
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        sent = await flood_with_pings(zombie)
        await zombie.wait_all_read()
        grown = server.memory_info().rss - before
        print(f"ping flood: {sent} pings sent, server RSS grew {grown / 2**20:.1f} MiB")
        await zombie.wait_closed_by_server()
    assert sent < PINGS, "the server took every ping"
    assert grown < RSS_BOUND


async def test_pings_past_the_frame_rate_are_closed_1008() -> None:
    async with running_server(ScriptedEngine(), frames_per_second=10) as url:
        async with raw_peer(url) as (peer, _):
            for _ in range(11):
                await peer.ws.ping()
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await peer.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, "too many frames")
        async with raw_peer(url) as (peer, _):  # pings within the rate are answered
            pongs = [await peer.ws.ping() for _ in range(10)]
            async with asyncio.timeout(TIMEOUT):
                await asyncio.gather(*pongs)

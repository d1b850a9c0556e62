"""A reply replayed to resumes that never read it (PROTOCOL.md section 10, ``?last=0``) is in
flight once per session at most: a resume drops the connection it replaces with what the server
still held for it, so resuming again and again cannot pile up copies of a reply in the server
(sessions/relay.py ``drop_last``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import psutil

from tests.hardening.test_message_retention import RSS_FOLLOWS_HOLDINGS
from tests.support import (
    TIMEOUT,
    ZombiePeer,
    raw_peer,
    server_process,
    tcp_queues,
    wait_until,
    zombie_peer,
)

REPLAYS = 8
REPLY_BYTES = 20_000_000  # scripted_server's "burst": 20 MB at once, then it runs on silently


async def burst_then_drop(url: str) -> str:
    """A ``burst`` reply read whole and dropped while it still runs: its resume token."""
    async with raw_peer(url, max_size=None) as (peer, ready):
        await peer.send({"type": "prompt", "id": "b", "text": "burst"})
        got = 0
        while got < REPLY_BYTES:
            frame = await peer.recv()
            got += len(frame["text"]) if frame["type"] == "token" else 0
        peer.ws.transport.abort()
    return str(ready["resume"])


@contextlib.asynccontextmanager
async def unread_replay(url: str) -> AsyncIterator[ZombiePeer]:
    """A resume that reads its ``ready`` and leaves (a close frame with code 4000: a drop)
    without reading the replay; yields once the server has written the replay to it."""
    async with zombie_peer(url) as peer:
        peer.ws.send_close(4000)
        await peer._flush()
        mine, server = (
            peer.writer.get_extra_info("sockname"),
            peer.writer.get_extra_info("peername"),
        )
        await wait_until(lambda: tcp_queues(server, mine)[0] > 0)  # the replay's first bytes
        yield peer


async def bytes_left(peer: ZombiePeer) -> int:
    """Everything the server still sends this peer, until it closes the connection."""
    total = 0
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(TIMEOUT):
            while data := await peer.reader.read(1 << 20):
                total += len(data)
    return total


async def test_a_session_has_one_unread_replay_in_flight_however_often_it_is_resumed(
    tmp_path: Path,
) -> None:
    options = ("--send-timeout-s", "600")  # only a resume can let go of an unread replay
    async with (
        server_process(tmp_path / "server.log", *options, env=RSS_FOLLOWS_HOLDINGS) as (proc, url),
        contextlib.AsyncExitStack() as stack,
    ):
        server = psutil.Process(proc.pid)
        token = await burst_then_drop(url)
        peers, rss = [], []
        for _ in range(REPLAYS):
            resume = f"{url}?resume={token}&last=0"
            peer = await stack.enter_async_context(unread_replay(resume))
            assert peer.ready["resumed"] == {"last_prompt": None, "reply": "b", "turns": 0}
            rss.append(server.memory_info().rss)
            peers.append(peer)
            token = peer.ready["resume"]
        left = [await bytes_left(peer) for peer in peers]
    grown = rss[-1] - rss[0]
    print(
        f"{REPLAYS} unread replays of a {REPLY_BYTES / 1e6:.0f} MB reply: server RSS grew"
        f" {grown / 2**20:.0f} MiB from the first to the last; bytes each still got: {left}"
    )
    # what the earlier ones still got was in the kernel's buffers already; the rest was let go
    assert all(n < REPLY_BYTES / 2 for n in left[:-1]), left
    assert left[-1] > REPLY_BYTES - 2**17  # the last one's replay is whole (less what it read)
    # copies piling up would grow it by 7 replies; one sample of RSS can land while the reply in
    # flight is held up to twice more (its frame, the transport's buffer), so it may swing by two
    assert grown < 3 * REPLY_BYTES

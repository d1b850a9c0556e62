"""Big messages are not kept once handled: connections that each sent one message near the size
limit and then idle hold no copy of it. And no permessage-deflate, with which such a message was
a few kB on the wire (README "Security and limits")."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import psutil

from tests.fakes.scripted import ScriptedEngine
from tests.support import raw_peer, running_server, server_process

CONNECTIONS = 20
FRAME_LIMIT = 2**20  # --max-frame-bytes: messages up to twice this are read, then refused
MESSAGE = bytes(2 * FRAME_LIMIT - 4096)  # zeros: ~2 kB once deflated
PER_CONNECTION_BOUND = 128 * 1024  # a session's own state is ~20 kB; the message is 2 MB
# glibc hands blocks this big back to the system as soon as they are freed, instead of keeping
# up to tens of MB of freed heap for reuse (its default adapts the threshold upwards): the
# server's RSS then follows what it holds
RSS_FOLLOWS_HOLDINGS = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


async def test_idle_connections_hold_no_copy_of_the_big_message_they_sent(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    options = ("--max-frame-bytes", str(FRAME_LIMIT), "--max-connections-per-client", "100")
    async with (
        server_process(log, *options, env=RSS_FOLLOWS_HOLDINGS) as (proc, url),
        AsyncExitStack() as stack,
    ):
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        for _ in range(CONNECTIONS):
            peer, _ = await stack.enter_async_context(raw_peer(url, max_size=None))
            await peer.ws.send(MESSAGE)
            refused = await peer.recv()
            assert (refused["type"], refused["code"]) == ("error", "too_large")
        grown = server.memory_info().rss - before
        print(
            f"message retention: {CONNECTIONS} idle connections that each sent"
            f" {len(MESSAGE) / 2**20:.1f} MiB: server RSS grew {grown / 2**20:.1f} MiB"
        )
    assert grown < CONNECTIONS * PER_CONNECTION_BOUND


async def test_permessage_deflate_is_not_negotiated_when_offered() -> None:
    async with (
        running_server(ScriptedEngine()) as url,
        raw_peer(url, compression="deflate") as (peer, _),
    ):
        assert "permessage-deflate" in peer.ws.request.headers["Sec-WebSocket-Extensions"]
        assert "Sec-WebSocket-Extensions" not in peer.ws.response.headers
        await peer.send({"type": "ping", "t": 1.0})
        assert (await peer.recv())["type"] == "pong"

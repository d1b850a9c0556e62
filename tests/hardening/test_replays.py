"""A reply replayed to resumes that never read it (PROTOCOL.md section 10, ``?last=0``) is in
flight once per session at most: a resume drops the connection it replaces with what the server
still held for it, so resuming again and again cannot pile up copies of a reply in the server
(sessions/relay.py ``drop_last``). Across sessions, ``--max-replays`` are written at once and
the rest wait their turn (sessions/gates.py), so many sessions resumed at once cannot either."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil

from tests.hardening.test_message_retention import RSS_FOLLOWS_HOLDINGS
from tests.prometheus import samples
from tests.support import (
    TIMEOUT,
    ZombiePeer,
    http_base,
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
        await peer.flush()
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


SESSIONS = 8
MAX_REPLAYS = 2


def server_queued(peer: ZombiePeer) -> int:
    """Bytes the server has queued in the kernel for ``peer`` (which reads nothing)."""
    mine, server = peer.writer.get_extra_info("sockname"), peer.writer.get_extra_info("peername")
    return tcp_queues(server, mine)[0]


def peak_rss_reset(pid: int) -> int:
    """The process's RSS now, its peak (VmHWM) set back to it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return int(psutil.Process(pid).memory_info().rss)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def replays_gauges(url: str) -> tuple[float, float]:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        found = samples((await http.get(f"{http_base(url)}/metrics")).text)
    return found["wschat_replays_in_flight"], found["wschat_replays_waiting"]


async def test_replays_of_sessions_resumed_at_once_are_written_a_few_at_a_time(
    tmp_path: Path,
) -> None:
    """Eight sessions, each with a 20 MB reply, resumed at once by peers that read nothing:
    ``--max-replays`` replays are written, the others wait (none is refused), and one whose
    peer leaves lets the next one in; the server's peak RSS grows by the replays written, not
    by all eight."""
    options = ["--send-timeout-s", "600", "--resume-grace-s", "600"]
    options += ["--max-concurrent", str(SESSIONS), "--max-replays", str(MAX_REPLAYS)]
    async with (
        server_process(tmp_path / "server.log", *options, env=RSS_FOLLOWS_HOLDINGS) as (proc, url),
        contextlib.AsyncExitStack() as stack,
    ):
        tokens = [await burst_then_drop(url) for _ in range(SESSIONS)]
        before = peak_rss_reset(proc.pid)
        peers = [
            await stack.enter_async_context(zombie_peer(f"{url}?resume={token}&last=0"))
            for token in tokens
        ]
        assert all(p.ready["resumed"]["reply"] == "b" for p in peers)
        waiting = (MAX_REPLAYS, SESSIONS - MAX_REPLAYS)
        await wait_until(lambda: sum(server_queued(p) > 0 for p in peers) == MAX_REPLAYS)
        async with asyncio.timeout(TIMEOUT):
            while await replays_gauges(url) != waiting:  # another process: nothing to await
                await asyncio.sleep(0.05)
        grown = peak_rss(proc.pid) - before
        written = [p for p in peers if server_queued(p) > 0]
        written[0].writer.transport.abort()  # its peer leaves: the next replay's turn
        await wait_until(lambda: sum(server_queued(p) > 0 for p in peers) == MAX_REPLAYS)
        after = await replays_gauges(url)
    print(
        f"{SESSIONS} sessions resumed at once, unread, {REPLY_BYTES / 1e6:.0f} MB replies,"
        f" --max-replays {MAX_REPLAYS}: server peak RSS +{grown / 2**20:.0f} MiB"
    )
    assert after == (MAX_REPLAYS, SESSIONS - MAX_REPLAYS - 1)
    # a replay written holds, for a moment, its encoded frame, the WebSocket frame and the
    # transport's copy: 3 replies' worth each, one more for the rest (all 8 at once: +13)
    assert grown < (3 * MAX_REPLAYS + 1) * REPLY_BYTES


async def test_a_resume_waiting_for_its_replay_turn_still_sees_its_peer_leave(
    tmp_path: Path,
) -> None:
    """With one replay's turn held by a peer that reads nothing, a second session's resume
    waits for its turn; its peer leaves meanwhile: that connection ends at once, so the
    session's next resume gets it back (the claim waits on the connection holding it)."""
    options = ["--send-timeout-s", "600", "--resume-grace-s", "600", "--max-replays", "1"]
    async with (
        server_process(tmp_path / "server.log", *options, env=RSS_FOLLOWS_HOLDINGS) as (_, url),
        contextlib.AsyncExitStack() as stack,
    ):
        first, second = [await burst_then_drop(url) for _ in range(2)]
        holder = await stack.enter_async_context(zombie_peer(f"{url}?resume={first}&last=0"))
        await wait_until(lambda: server_queued(holder) > 0)  # its replay has the turn
        async with zombie_peer(f"{url}?resume={second}&last=0") as waiting:
            assert await replays_gauges(url) == (1, 1)
        # left (its socket aborted): a new resume of that session, not a new session
        async with zombie_peer(f"{url}?resume={waiting.ready['resume']}&last=0") as again:
            gauges = await replays_gauges(url)
    assert again.ready["session"] == waiting.ready["session"]
    assert again.ready["resumed"]["reply"] == "b"
    assert gauges == (1, 1)  # the first one's turn is still held: this one waits in its place

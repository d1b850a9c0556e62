"""The bundled client, library and ``wschat chat``, behind HAProxy in front of two replicas that
share their sessions in Redis (cluster.py, all real processes): SIGTERM to the replica holding
the session mid-reply. The reply finishes there (the drain's grace period), each piece once; then
the client leaves the draining replica and resumes its session on the other one, the
conversation kept: the next reply is the conversation's second exchange.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
from wschat.client import Reply, connect
from wschat.client.status import RESUMED_NOTICE
from wschat.protocol import FinishReason

from tests.client.cli_process import cli
from tests.client.test_resume import resumed
from tests.deploy.cluster import HAPROXY, Replica, cluster, holders
from tests.deploy.test_haproxy import LONG, other
from tests.hardening.scripted_server import STEADY_REPLY
from tests.hardening.test_shutdown import exit_status
from tests.sessions.test_redis_replicas import REDIS_SERVER
from tests.support import TIMEOUT, next_stats, raw_peer, stats_socket

pytestmark = pytest.mark.skipif(
    not (Path(HAPROXY).exists() and Path(REDIS_SERVER).exists()),
    reason="needs haproxy and redis-server",
)

STEADY = "a steady one"  # a reply of 40 pieces, 4 s (tests/hardening/scripted_server.py)
GRACE_MS = 30_000  # cluster.py's --shutdown-grace-s


async def test_the_library_finishes_the_reply_then_resumes_on_the_other_replica(
    tmp_path: Path,
) -> None:
    said: list[tuple[int, bool]] = []  # each goaway, and whether the reply had finished then
    moved = asyncio.Event()
    async with cluster(tmp_path) as deployed:
        opening = connect(
            deployed.url,
            timeout=TIMEOUT,
            reply_timeout=TIMEOUT,
            on_goaway=lambda frame: said.append((frame.in_ms, reply.finished)),
            on_resume=lambda ready: moved.set(),
        )
        async with opening as chat:
            session = chat.session
            draining = (await holders(deployed.replicas, [session]))[session]
            reply = chat.prompt(STEADY)
            pieces = [await anext(reply)]
            draining.process.send_signal(signal.SIGTERM)
            pieces += [piece async for piece in reply]
            assert "".join(pieces) == reply.text == STEADY_REPLY
            assert reply.done is not None and reply.done.reason is FinishReason.STOP
            assert (reply.turn, said) == (1, [(GRACE_MS, False)])
            await resumed(chat, moved, TIMEOUT)
            staying = other(deployed.replicas, draining)
            assert (chat.session, chat.turns, chat.resumes, chat.goaway) == (session, 1, 1, None)
            assert (await holders([staying], [session]))[session] is staying
            following = await chat.prompt("go on").wait(TIMEOUT)
        assert (following.reason, following.turn) == (FinishReason.STOP, 2)
        assert await exit_status(draining.process) == 0


async def test_an_idle_client_leaves_at_the_goaway_and_a_prompt_sent_then_goes_to_the_other(
    tmp_path: Path,
) -> None:
    prompted: list[Reply] = []  # the prompt sent as the goaway came: not to the draining replica
    moved = asyncio.Event()
    async with cluster(tmp_path) as deployed, raw_peer(deployed.url) as (peer, busy):
        opening = connect(
            deployed.url,  # from the peer's address: the same replica
            timeout=TIMEOUT,
            on_goaway=lambda frame: prompted.append(chat.prompt("hello")),
            on_resume=lambda ready: moved.set(),
        )
        async with opening as chat:
            found = await holders(deployed.replicas, [chat.session, busy["session"]])
            draining = found[chat.session]
            assert found[busy["session"]] is draining
            await peer.send(LONG)
            await peer.recv_until("token")
            draining.process.send_signal(signal.SIGTERM)
            await resumed(chat, moved, TIMEOUT)
            await peer.recv_until("token")  # the drain goes on: its other reply still runs
            (reply,) = prompted
            done = await reply.wait(TIMEOUT)
            assert (done.reason, done.turn, chat.resumes) == (FinishReason.STOP, 1, 1)
            staying = other(deployed.replicas, draining)
            assert (await holders([staying], [chat.session]))[chat.session] is staying
        await peer.send({"type": "cancel", "id": "L"})
        await peer.recv_until("done")


async def replica_with_a_session(replicas: Sequence[Replica]) -> Replica:
    """The replica whose ``/v1/stats`` live table holds a session (the test's only one)."""
    for replica in replicas:
        async with stats_socket(replica.url) as ws:
            await next_stats(ws)  # may be a second old: the next one is taken after the call
            if (await next_stats(ws)).live:
                return replica
    raise AssertionError("no replica holds a session")


async def test_wschat_chat_finishes_the_reply_then_resumes_on_the_other_replica(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as deployed, cli("chat", "--url", deployed.url) as chat:
        assert (await chat.stderr_line()).startswith("connected to scripted")
        await chat.send(STEADY)
        assert await chat.read_until(" m0") == " m0"
        draining = await replica_with_a_session(deployed.replicas)
        draining.process.send_signal(signal.SIGTERM)
        assert await chat.stderr_line() == f"[the server is shutting down in {GRACE_MS} ms]\n"
        assert await chat.read_until("\n") == STEADY_REPLY.removeprefix(" m0") + "\n"
        assert await chat.stderr_line() == RESUMED_NOTICE + "\n"
        staying = other(deployed.replicas, draining)
        assert await replica_with_a_session([staying]) is staying
        await chat.send("go on")  # the conversation holds "a steady one": a steady reply
        assert await chat.read_until("\n") == STEADY_REPLY + "\n"
        await chat.send("/history")
        assert await chat.read_until("go on\n") == f"  1  {STEADY}\n  2  go on\n"
        await chat.send("/quit")
        assert await chat.exit_status() == 0
        assert await chat.stderr() == ""
        assert await exit_status(draining.process) == 0

"""deploy/haproxy.cfg with real parts (cluster.py): HAProxy 2.6 in front of two gateway replicas
sharing their sessions in a real ``redis-server``, all on loopback, started and stopped by pid.

A resume that names its session (``?session=``) goes back to the replica that served it, and
HAProxy logs no query string; a replica that drains (SIGTERM: ``/readyz`` 503) is taken out,
new sessions go to the other, its running reply streams on, and its sessions resume on the other
replica; a replica killed mid-reply: the client resumes through HAProxy on the other replica
with every finished turn, and the next prompt streams.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.deploy.cluster import HAPROXY, Replica, cluster, holders, status_is
from tests.hardening.test_shutdown import exit_status, frames_until_closed
from tests.sessions.test_redis_replicas import (
    REDIS_SERVER,
    detached,
    reply_checkpoint,
    turn,
    turn_refused,
)
from tests.support import RawPeer, raw_peer

pytestmark = pytest.mark.skipif(
    not (Path(HAPROXY).exists() and Path(REDIS_SERVER).exists()),
    reason="needs haproxy and redis-server",
)

LONG = {"type": "prompt", "id": "L", "text": "a long one"}  # a minute of tokens


def resume_url(url: str, ready: dict[str, str]) -> str:
    """A reconnect as the bundled clients make it: the routing key beside the token."""
    return f"{url}?session={ready['session']}&resume={ready['resume']}"


def other(replicas: list[Replica], one: Replica) -> Replica:
    (found,) = [r for r in replicas if r is not one]
    return found


async def test_a_resume_with_the_same_routing_key_lands_on_the_same_replica(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as deployed:
        async with contextlib.AsyncExitStack() as stack:
            readies = [
                (await stack.enter_async_context(raw_peer(deployed.url)))[1] for _ in "123456"
            ]
            sessions = [ready["session"] for ready in readies]
            first = await holders(deployed.replicas, sessions)
        assert set(first.values()) == set(deployed.replicas)  # new sessions go round robin
        for session in sessions:
            await detached(deployed.store, session)
        async with contextlib.AsyncExitStack() as stack:
            for ready in readies:
                _, again = await stack.enter_async_context(
                    raw_peer(resume_url(deployed.url, ready))
                )
                assert again["session"] == ready["session"]
            assert await holders(deployed.replicas, sessions) == first
    log = (tmp_path / "haproxy.log").read_text()
    assert log.count("GET /v1/chat HTTP/1.1") == 12
    assert "resume=" not in log and not any(ready["resume"] in log for ready in readies)


async def test_a_draining_replica_is_taken_out_and_its_sessions_resume_on_the_other(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as deployed:
        async with raw_peer(deployed.url) as (peer, ready):
            session = ready["session"]
            draining = (await holders(deployed.replicas, [session]))[session]
            staying = other(deployed.replicas, draining)
            await peer.send(LONG)
            await peer.recv_until("token")
            draining.process.send_signal(signal.SIGTERM)
            await peer.recv_until("goaway")
            await deployed.haproxy.wait_servers(status_is("DOWN", draining))
            checked = (await deployed.haproxy.servers())[draining.address]
            assert (checked["check_status"], checked["check_code"]) == ("L7STS", "503")
            await peer.recv_until("token")  # the reply streams on through the drain
            async with contextlib.AsyncExitStack() as stack:
                fresh = [
                    (await stack.enter_async_context(raw_peer(deployed.url)))[1] for _ in "1234"
                ]
                placed = await holders([staying], [f["session"] for f in fresh])
                assert set(placed.values()) == {staying}
            await peer.send({"type": "cancel", "id": "L"})
            frames, code = await frames_until_closed(peer)
        assert [f["reason"] for f in frames if f["type"] == "done"] == ["cancelled"]
        assert (code, await exit_status(draining.process)) == (1001, 0)
        async with raw_peer(resume_url(deployed.url, ready)) as (peer, resumed):
            assert resumed["session"] == session  # left in Redis by the drain
            assert (await turn_refused(peer, "L"))["code"] == "invalid_params"
            await streams(peer, "next", "go on")


async def test_a_replica_killed_mid_reply_leaves_its_turns_and_partial_reply_to_the_other(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as deployed:
        async with raw_peer(deployed.url) as (peer, _):  # the same turns, nothing killed
            await turn(peer, "S", "a short one")
            unmoved = await turn(peer, "next", "go on")
        async with raw_peer(deployed.url) as (peer, ready):
            session = ready["session"]
            await turn(peer, "S", "a short one")
            killed = (await holders(deployed.replicas, [session]))[session]
            await peer.send(LONG)
            await peer.recv_until("token")
            await reply_checkpoint(deployed.store, session, 1)  # at most a second behind
            killed.process.kill()
            with pytest.raises(websockets.ConnectionClosedError):
                await peer.recv_until("done")
        await detached(deployed.store, session)  # the dead owner's lease lapsed
        async with raw_peer(resume_url(deployed.url, ready)) as (peer, resumed):
            assert resumed["session"] == session
            survivor = other(deployed.replicas, killed)
            assert (await holders([survivor], [session]))[session] is survivor
            assert (await turn_refused(peer, "S"))["code"] == "invalid_params"
            start = await streams(peer, "next", "go on")
    # The finished turn is in the conversation, and so is the cut reply as a cancelled
    # exchange (its checkpointed tokens): the next prompt holds more than where nothing was
    # killed (tests/sessions/test_redis_replicas.py checks the exchange token for token).
    assert start["prompt_tokens"] > unmoved["usage"]["prompt_tokens"]


async def streams(peer: RawPeer, id: str, text: str) -> dict[str, Any]:
    """A prompt whose reply streams: its first token comes, then it is cancelled (a reply
    after a long one in the conversation is long too: the scripted engine reads all of it) and
    ends with one ``done``; returns its ``start``."""
    await peer.send({"type": "prompt", "id": id, "text": text})
    frames = await peer.recv_until("token")
    await peer.send({"type": "cancel", "id": id})
    frames += await peer.recv_until("done")
    assert [f["type"] for f in frames[:2]] == ["start", "token"]
    assert frames[-1]["reason"] in ("cancelled", "stop")
    return frames[0]

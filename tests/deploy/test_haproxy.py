"""deploy/haproxy.cfg with real parts (cluster.py): HAProxy 2.6 in front of two gateway replicas
sharing their sessions in a real ``redis-server``, all on loopback, started and stopped by pid.

A resume that names its session (``?session=``) goes back to the replica that served it, and
HAProxy logs no query string; any other connection goes by the client's address, whatever
``?session=`` it names; a client cannot name its address (``X-Forwarded-For``) to the replicas;
one address opening sessions fast gets 429 before it can push another session's entry out of
the stick table; a replica that drains (SIGTERM: ``/readyz`` 503) is taken out,
new sessions go to the other, its running reply streams on, and its sessions resume on the other
replica; a replica killed mid-reply: the client resumes through HAProxy on the other replica
with every finished turn, and the next prompt streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import msgpack
import pytest
import websockets
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol
from wschat.protocol import SUBPROTOCOL, CloseCode

from tests.deploy.cluster import (
    HAPROXY,
    Cluster,
    Replica,
    client_at,
    cluster,
    holders,
    status_is,
)
from tests.hardening.test_shutdown import exit_status, frames_until_closed
from tests.sessions.test_redis_replicas import (
    REDIS_SERVER,
    detached,
    reply_checkpoint,
    turn,
    turn_refused,
)
from tests.support import TIMEOUT, RawPeer, raw_peer

pytestmark = pytest.mark.skipif(
    not (Path(HAPROXY).exists() and Path(REDIS_SERVER).exists()),
    reason="needs haproxy and redis-server",
)

LONG = {"type": "prompt", "id": "L", "text": "a long one"}  # a minute of tokens
# eight clients, each at a loopback address of its own
CLIENTS = [f"127.0.0.{n}" for n in range(10, 18)]
NO_SUCH_SESSION = "0123456789abcdef"


def resume_url(url: str, ready: dict[str, str]) -> str:
    """A reconnect as the bundled clients make it: the routing key beside the token."""
    return f"{url}?session={ready['session']}&resume={ready['resume']}"


def other(replicas: list[Replica], one: Replica) -> Replica:
    (found,) = [r for r in replicas if r is not one]
    return found


# local: deploy/haproxy-local.cfg, the two replicas at fixed ports of 127.0.0.1 (docs/deploy.md)
@pytest.mark.parametrize("local", [False, True], ids=["dns", "local"])
async def test_a_resume_with_the_same_routing_key_lands_on_the_same_replica(
    tmp_path: Path, local: bool
) -> None:
    async with cluster(tmp_path, local=local) as deployed:
        readies, first = await one_session_each(deployed, deployed.url)
        assert set(first.values()) == set(deployed.replicas)  # new sessions: by address
        sessions = [ready["session"] for ready in readies]
        for session in sessions:
            await detached(deployed.store, session)
        # every client resumes from one address of another (a network change): the stick
        # table, not the address, takes each back to its replica
        async with contextlib.AsyncExitStack() as stack:
            for ready in readies:
                _, again = await stack.enter_async_context(
                    raw_peer(resume_url(deployed.url, ready))
                )
                assert again["session"] == ready["session"]
            assert await holders(deployed.replicas, sessions) == first
        # HAProxy logs a tunnel once both sides closed: its hard stop would lose the last ones
        assert await logged(tmp_path / "haproxy.log", "GET /v1/chat HTTP/1.1", 16) == 16
    log = (tmp_path / "haproxy.log").read_text()
    assert "resume=" not in log and not any(ready["resume"] in log for ready in readies)


async def logged(log: Path, line: str, count: int) -> int:
    """How many times ``line`` is in ``log`` once it is there ``count`` times, or at the
    timeout."""
    async with asyncio.timeout(TIMEOUT):
        while (found := log.read_text().count(line)) < count:
            await asyncio.sleep(0.05)
    return found


async def one_session_each(
    deployed: Cluster, url: str
) -> tuple[list[dict[str, Any]], dict[str, Replica]]:
    """The ``ready`` of a connection to ``url`` from each of CLIENTS, and the replica each
    session was on; the connections are closed and the first session is detached."""
    async with contextlib.AsyncExitStack() as stack:
        readies = [
            (await stack.enter_async_context(raw_peer(url, **client_at(host))))[1]
            for host in CLIENTS
        ]
        placed = await holders(deployed.replicas, [r["session"] for r in readies])
    await detached(deployed.store, readies[0]["session"])
    return readies, placed


def elsewhere(readies: list[dict[str, Any]], placed: dict[str, Replica], home: Replica) -> str:
    """A client address whose session the hash put on another replica than ``home``."""
    return next(
        host
        for host, ready in zip(CLIENTS, readies, strict=True)
        if placed[ready["session"]] is not home
    )


async def holder(deployed: Cluster, session: str) -> Replica:
    return (await holders(deployed.replicas, [session]))[session]


async def test_a_session_id_routes_only_a_resume_of_a_session_a_replica_named(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as deployed:
        # one id that names no session, from eight addresses: it picks no replica
        stale = f"{deployed.url}?session={NO_SUCH_SESSION}&resume=stale"
        readies, placed = await one_session_each(deployed, stale)
        assert set(placed.values()) == set(deployed.replicas)
        named, home = readies[0], placed[readies[0]["session"]]
        away = elsewhere(readies, placed, home)
        # a session that exists, named by a new connection (no resume): still by address
        naming = f"{deployed.url}?session={named['session']}"
        async with raw_peer(naming, **client_at(away)) as (_, fresh):
            assert fresh["session"] != named["session"]
            assert await holder(deployed, fresh["session"]) is not home
        # its resume, from the same address: back to the replica that holds it
        async with raw_peer(resume_url(deployed.url, named), **client_at(away)) as (_, resumed):
            assert resumed["session"] == named["session"]
            assert await holder(deployed, named["session"]) is home


async def first_answer(
    stack: contextlib.AsyncExitStack, url: str, host: str, forwarded_for: str
) -> str | int:
    """``ready``, or the close code of a connection the server accepted only to refuse; the
    connection stays open until ``stack`` closes."""
    connect = websockets.connect(
        url,
        subprotocols=[Subprotocol(SUBPROTOCOL)],
        additional_headers={"X-Forwarded-For": forwarded_for},
        **client_at(host),
    )
    async with asyncio.timeout(TIMEOUT):
        ws = await stack.enter_async_context(connect)
        try:
            return str(msgpack.unpackb(await ws.recv())["type"])
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code


async def test_a_client_cannot_name_its_own_address_through_haproxy(tmp_path: Path) -> None:
    # replicas that trust any proxy: what HAProxy forwards must be the client's address alone
    options = ("--forwarded-allow-ips", "*", "--max-connections-per-client", "2")
    async with cluster(tmp_path, *options) as deployed, contextlib.AsyncExitStack() as stack:
        # every connection on one replica: the id names no session, so the address decides
        url = f"{deployed.url}?session={NO_SUCH_SESSION}"
        answers = [
            await first_answer(stack, url, "127.0.0.20", f"198.51.100.{n}") for n in range(4)
        ]
    assert answers == ["ready", "ready", CloseCode.TRY_AGAIN_LATER, CloseCode.TRY_AGAIN_LATER]


async def handshake_status(url: str, host: str) -> int:
    """The status HAProxy answers a chat handshake from ``host`` with (the socket, if any, is
    closed at once)."""
    try:
        async with asyncio.timeout(TIMEOUT), websockets.connect(url, **client_at(host)):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


async def test_one_address_opening_sessions_fast_cannot_push_another_session_out(
    tmp_path: Path,
) -> None:
    limits = {"WSCHAT_SESSION_TABLE_SIZE": "50", "WSCHAT_HANDSHAKES_PER_MINUTE": "20"}
    async with cluster(tmp_path, proxy=limits) as deployed:
        readies, placed = await one_session_each(deployed, deployed.url)
        kept, home = readies[0], placed[readies[0]["session"]]
        away = elsewhere(readies, placed, home)
        # 60 sessions as fast as one address can open them, in a table of 50
        answers = [await handshake_status(deployed.url, "127.0.0.1") for _ in range(60)]
        assert 20 <= answers.count(101) <= 22  # the rate is a sliding estimate: a little slack
        assert answers.count(429) == 60 - answers.count(101)
        # the kept session's entry is still there: its resume, from an address the hash sends
        # to the other replica, reaches the replica that holds it
        async with raw_peer(resume_url(deployed.url, kept), **client_at(away)) as (_, resumed):
            assert resumed["session"] == kept["session"]
            assert await holder(deployed, kept["session"]) is home


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

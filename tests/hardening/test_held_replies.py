"""Replies held for a resume after a drop (PROTOCOL.md section 10) cannot take the server from
other clients: a held reply keeps its address's connection place until it ends or is resumed,
a prompt dropped before its first token is cancelled at once, and the queue is shared fairly
between addresses (sessions/slots.py). Clients connect from addresses of their own on the
loopback network (127.0.0.x), as clients on other hosts would."""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

import websockets

from tests.fakes.scripted import Script, ScriptedEngine
from tests.hardening.scripted_server import script
from tests.support import RawPeer, closed_before_ready, raw_peer, running_server

ATTACKER = "127.0.0.2"
OTHERS = [f"127.0.0.{n}" for n in range(3, 12)]
TRIES = 80  # bounded: more than the slots and the queue hold together (4 + 64)


def peer_from(
    url: str, address: str
) -> AbstractAsyncContextManager[tuple[RawPeer, dict[str, Any]]]:
    """``raw_peer`` from ``address`` (``ConnectionClosed`` when refused)."""
    return raw_peer(url, local_addr=(address, 0))


async def prompt_and_drop(url: str, n: int) -> str:
    """One try of the attacker: a long prompt, dropped once it is queued or has sent its first
    token. ``held`` (it ran), ``queued`` or ``refused`` (a close or an ``error``)."""
    try:
        async with peer_from(url, ATTACKER) as (peer, _):
            await peer.send({"type": "prompt", "id": f"a{n}", "text": "a long story"})
            first = await peer.recv()
            if first["type"] == "start":
                await peer.recv_until("token")
            peer.ws.transport.abort()  # a drop: no close frame
            return {"start": "held", "queued": "queued"}.get(first["type"], "refused")
    except websockets.ConnectionClosed:
        return "refused"


async def ask(url: str, address: str) -> dict[str, Any]:
    """A short prompt from ``address``: its ``done``, or the ``error`` that refused it."""
    async with peer_from(url, address) as (peer, _):
        await peer.send({"type": "prompt", "id": "q", "text": "hello"})
        while True:
            frame = await peer.recv()
            if frame["type"] in ("done", "error"):
                return frame


async def test_prompts_dropped_from_one_address_leave_the_server_to_others() -> None:
    """PROTOCOL.md section 10 with --max-concurrent 4, a queue of 64 and 2 connections per
    address: one address that prompts and drops, never holding more than one open connection,
    used to keep every other client's prompt refused ``overloaded``."""
    settings: dict[str, Any] = {"max_concurrent": 4, "max_connections_per_client": 2}
    async with running_server(ScriptedEngine(script), **settings) as url:
        outcomes: list[str] = []
        for n in range(TRIES):  # until refused five times running
            outcomes.append(await prompt_and_drop(url, n))
            if outcomes[-5:] == ["refused"] * 5:
                break
        started = time.perf_counter()
        answers = await asyncio.gather(*(ask(url, address) for address in OTHERS))
        seconds = time.perf_counter() - started
    served = [a for a in answers if a["type"] == "done" and a["reason"] == "stop"]
    print(
        f"attacker: {outcomes.count('held')} held, {outcomes.count('queued')} queued,"
        f" {outcomes.count('refused')} refused; others: {len(served)} of {len(OTHERS)}"
        f" served in {seconds:.1f} s"
    )
    assert len(served) == len(OTHERS), answers
    assert outcomes.count("held") <= settings["max_connections_per_client"]


async def test_open_connections_of_one_address_cannot_keep_another_out_of_the_queue() -> None:
    """The connections one address holds open fill every slot and the queue (alone, it may);
    another address's prompt still gets in, ahead of that address's waiting ones, and the newest
    of those makes room for it (``overloaded``, then ``done``)."""
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(
            running_server(ScriptedEngine(script), max_concurrent=2, max_queue=3)
        )
        hog = [(await stack.enter_async_context(peer_from(url, ATTACKER)))[0] for _ in range(6)]
        firsts = []
        for n, peer in enumerate(hog):
            await peer.send({"type": "prompt", "id": f"a{n}", "text": "a long story"})
            firsts.append((await peer.recv())["type"])
        assert firsts == ["start", "start", "queued", "queued", "queued", "error"]
        async with peer_from(url, OTHERS[0]) as (other, _):
            await other.send({"type": "prompt", "id": "q", "text": "hello"})
            queued = await other.recv()
            pushed_out = await hog[4].recv_until("done")
            for peer in hog[:2]:  # the running ones end: the other address is next
                await peer.send({"type": "cancel"})
            frames = await other.recv_until("done")
    assert queued == {"type": "queued", "id": "q", "position": 1}
    assert [(f["type"], f.get("code"), f.get("reason")) for f in pushed_out[-2:]] == [
        ("error", "overloaded", None),
        ("done", None, "error"),
    ]
    assert frames[-1]["reason"] == "stop"


async def test_a_held_reply_keeps_its_connection_place_until_it_is_resumed() -> None:
    engine = ScriptedEngine(lambda r: Script([f" t{i}" for i in range(10_000)], delay_s=0.01))
    async with running_server(engine, max_connections_per_client=1) as url:
        async with peer_from(url, ATTACKER) as (peer, ready):
            await peer.send({"type": "prompt", "id": "p1", "text": "go"})
            await peer.recv_until("token")
            peer.ws.transport.abort()
        # dropped: its reply goes on, and counts as the address's one connection
        code, reason = await closed_before_ready(url, local_addr=(ATTACKER, 0))
        assert (code, reason) == (1013, "too many connections from this address (1)")
        # a resume takes it back, which gives that place up
        resume = f"{url}?resume={ready['resume']}&last=1"
        async with peer_from(resume, ATTACKER) as (peer, resumed):
            assert resumed["resumed"]["reply"] == "p1"
            await peer.recv_until("token")
            await peer.send({"type": "cancel"})
            done = (await peer.recv_until("done"))[-1]
    assert done["reason"] == "cancelled"

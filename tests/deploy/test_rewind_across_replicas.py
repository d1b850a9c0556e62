"""Rewind and regenerate across replicas (PROTOCOL.md sections 5 and 10): two real gateway
processes on the tiny dev model sharing their sessions in a real ``redis-server``, all on
loopback, started and stopped by their pids (tests/sessions/test_redis_replicas.py).

A rewind on one replica is the conversation a resume on the other continues: the next prompt
is the prompt a fresh conversation with the kept turns has (its tokens and greedy text), and
``ready.resumed`` names the last kept prompt and how many exchanges are held. A rewind is a turn
boundary: the store holds the rewound conversation with no later frame, so a replica killed
right after it leaves that. A regenerate after a resume on the other replica repeats the kept
user turn (the server keeps it, not the client); a regenerate whose replica dies mid-reply
replaces the exchange it regenerates with its partial reply, kept as cancelled, as a prompt's
is.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from wschat.server.sessions.snapshot import unpack

from tests.sessions import test_redis_replicas
from tests.sessions.test_mid_reply_resume import resume_url, tokens_until
from tests.sessions.test_redis_replicas import (
    LONG,
    REDIS_SERVER,
    RedisProcess,
    detached,
    gateway_process,
    reply_checkpoint,
    turn,
    turn_refused,
)
from tests.support import TIMEOUT, RawPeer, raw_peer

pytestmark = pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="needs redis-server")

TURNS = ("hello there", "tell me more", "and the third")
NEXT = "and now something else"

# Redis and two replicas, a and b, started once for this module as for that one
shared_cluster = test_redis_replicas.shared_cluster
cluster = test_redis_replicas.cluster


@pytest.fixture
async def replica_c(
    cluster: tuple[RedisProcess, str, str], tmp_path: Path, tiny_text_dir: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """A third replica on the shared Redis, for a test to kill; its url."""
    store, _, _ = cluster
    async with gateway_process(tiny_text_dir, store.url, tmp_path / "c.log") as started:
        yield started


async def rewind(peer: RawPeer, keep: int) -> dict[str, Any]:
    """A ``rewind``, and its answer, the very next frame."""
    await peer.send({"type": "rewind", "keep": keep})
    return await peer.recv()


async def regenerate(peer: RawPeer, id: str, max_new_tokens: int = 8) -> list[dict[str, Any]]:
    """A ``regenerate`` to its ``done``: its frames."""
    params = {"max_new_tokens": max_new_tokens}
    await peer.send({"type": "regenerate", "id": id, "params": params})
    return await peer.recv_until("done")


async def conversation(peer: RawPeer, texts: tuple[str, ...]) -> list[dict[str, Any]]:
    """One turn per text, prompts ``p1``, ``p2``, ...: their ``done`` frames."""
    return [await turn(peer, f"p{n}", text) for n, text in enumerate(texts, 1)]


async def stored_exchanges(store: RedisProcess, session: str, count: int) -> None:
    """Until the stored state of ``session`` holds ``count`` exchanges and no running turn."""
    client = aioredis.from_url(store.url)
    try:
        async with asyncio.timeout(TIMEOUT):
            while True:
                data = await client.get(f"wschat:s:{session}")
                if isinstance(data, bytes):
                    state = unpack(data)
                    if not state["running"] and len(state["chat"]["exchanges"]) == count:
                        return
                await asyncio.sleep(0.02)  # another process writes it: nothing to await
    finally:
        await client.aclose()


async def test_a_resume_on_another_replica_continues_from_the_rewound_conversation(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    store, a, b = cluster
    async with raw_peer(a) as (peer, ready):
        await conversation(peer, TURNS)
        rewound = await rewind(peer, 1)
    await detached(store, ready["session"])
    async with raw_peer(f"{b}?resume={ready['resume']}") as (peer, resumed):
        after = await turn(peer, "p4", NEXT)
        reused = await turn_refused(peer, "p2")  # a dropped exchange's id stays used
    async with raw_peer(b) as (peer, _):
        await turn(peer, "p1", TURNS[0])
        fresh = await turn(peer, "p4", NEXT)
    assert rewound == {"type": "rewound", "turns": 1}
    assert resumed["session"] == ready["session"]
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": None, "turns": 1}
    assert after["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
    assert (after["text"], after["turn"]) == (fresh["text"], 2)
    assert (reused["code"], reused["id"]) == ("invalid_params", "p2")


async def test_a_regenerate_after_a_resume_on_another_replica_repeats_the_kept_user_turn(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    store, a, b = cluster
    async with raw_peer(a) as (peer, ready):
        first, second = await conversation(peer, TURNS[:2])
    await detached(store, ready["session"])
    async with raw_peer(f"{b}?resume={ready['resume']}") as (peer, resumed):
        again = (await regenerate(peer, "r2"))[-1]
        after = await turn(peer, "p3", NEXT)
    async with raw_peer(b) as (peer, _):
        fresh = (await conversation(peer, (*TURNS[:2], NEXT)))[-1]
    assert resumed["resumed"] == {"last_prompt": "p2", "reply": None, "turns": 2}
    # greedy: the same user turn after the same first exchange, the same reply, in its place
    assert again["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"]
    assert (again["text"], again["turn"]) == (second["text"], 2)
    assert after["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
    assert (after["text"], after["turn"]) == (fresh["text"], 3)
    assert first["turn"] == 1


async def test_a_replica_killed_right_after_a_rewind_leaves_the_rewound_conversation(
    cluster: tuple[RedisProcess, str, str], replica_c: tuple[subprocess.Popen[bytes], str]
) -> None:
    store, _, b = cluster
    c_process, c = replica_c
    async with raw_peer(c) as (peer, ready):
        await conversation(peer, TURNS)
        assert await rewind(peer, 1) == {"type": "rewound", "turns": 1}
        # the rewind alone is a boundary: no later frame, no detach, and it is stored
        await stored_exchanges(store, ready["session"], 1)
        c_process.kill()  # SIGKILL, while the connection still holds the session
        c_process.wait(TIMEOUT)
    # b waits for c's lease to lapse rather than starting a new session
    async with raw_peer(f"{b}?resume={ready['resume']}") as (peer, resumed):
        after = await turn(peer, "p4", NEXT)
    async with raw_peer(b) as (peer, _):
        await turn(peer, "p1", TURNS[0])
        fresh = await turn(peer, "p4", NEXT)
    assert resumed["session"] == ready["session"]
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": None, "turns": 1}
    assert after["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
    assert after["text"] == fresh["text"]


async def test_a_regenerate_whose_replica_dies_mid_reply_replaces_the_exchange_as_cancelled(
    cluster: tuple[RedisProcess, str, str], replica_c: tuple[subprocess.Popen[bytes], str]
) -> None:
    store, _, b = cluster
    c_process, c = replica_c
    async with raw_peer(c) as (peer, ready):
        await conversation(peer, (TURNS[0], LONG))
        await peer.send({"type": "regenerate", "id": "r2", "params": {"max_new_tokens": 1000}})
        got = await tokens_until(peer, 1)
        partial = await reply_checkpoint(store, ready["session"], 12)
        c_process.kill()  # SIGKILL, mid-reply
        c_process.wait(TIMEOUT)
    async with raw_peer(resume_url(b, ready, got[-1]["index"])) as (peer, resumed):
        after = await turn(peer, "p3", NEXT)
    # the same conversation on b in one go, the second reply cut where the checkpoint was
    async with raw_peer(b) as (peer, _):
        await turn(peer, "p1", TURNS[0])
        cut = await turn(peer, "p2", LONG, max_new_tokens=len(partial))
        unbroken = await turn(peer, "p3", NEXT)
    assert resumed["session"] == ready["session"]
    # the reply was lost with its replica; the regenerated exchange is the conversation's last
    assert resumed["resumed"] == {"last_prompt": "r2", "reply": None, "turns": 2}
    assert (cut["reason"], cut["usage"]["completion_tokens"]) == ("length", len(partial))
    assert after["usage"]["prompt_tokens"] == unbroken["usage"]["prompt_tokens"]
    assert (after["text"], after["turn"]) == (unbroken["text"], 3)

"""States read back from Redis are checked before a resume takes them, with a real
``redis-server``, a real server and WebSocket clients: a state tampered with gives a new session
(and the batch it would have joined goes on), a huge one is read and checked off the event loop,
an oversize one is refused without a byte of it being read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis
from wschat.server.sessions.snapshot import pack, unpack

from tests.fakes.scripted import ScriptedEngine
from tests.hardening.test_redis_resume import stored
from tests.sessions.test_mid_reply_resume import prompt, tokens_until
from tests.sessions.test_redis_replicas import (
    REDIS_SERVER,
    RedisProcess,
    detached,
    redis_server,
    turn,
)
from tests.support import TIMEOUT, RawPeer, raw_peer, running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.loader import LoadedModel

pytestmark = pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="needs redis-server")

PACE_S = 0.05  # between one pong and the next ping


async def store_set(store_url: str, key: str, value: bytes) -> None:
    client = aioredis.from_url(store_url)
    try:
        await client.set(key, value, keepttl=True)
    finally:
        await client.aclose()


def out_of_vocabulary(state: dict[str, Any], _: dict[str, Any]) -> None:
    state["chat"]["exchanges"][0]["user"] += [10**9, -5]


def checkpoint_out_of_range(state: dict[str, Any], checkpoint: dict[str, Any]) -> None:
    """A reply that was running, its checkpoint holding ids no model has."""
    user = state["chat"]["exchanges"][0]["user"]
    state["running"] = {"id": "p9", "turn": {"user": user, "image_ids": [], "images": []}}
    checkpoint.update({"id": "p9", "ids": [10**12, -3]})


def another_engine(state: dict[str, Any], _: dict[str, Any]) -> None:
    state["engine"] = "0123456789abcdef"  # another model's or tokenizer's fingerprint


def huge_last_prompt(state: dict[str, Any], _: dict[str, Any]) -> None:
    state["last_prompt"] = "x" * (4 << 20)


def foreign_kept_reply(state: dict[str, Any], _: dict[str, Any]) -> None:
    """A reply kept for the resume (EDIT-1) whose id the session never used."""
    record = {"text": " t0", "frames": [[1, 3, None]]}
    state["relay"] = {"reply": "zz", "in_flight": True, "ending": [], "record": record}


@pytest.fixture
async def batched3(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    from wschat.server.engine.local.batched import BatchedEngine
    from wschat.server.engine.local.options import LocalEngineOptions

    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=3, prefill_tokens=64))
    yield engine
    await engine.aclose()


async def tamper(store_url: str, session: str, change: Callable[..., None]) -> None:
    state = unpack(await stored(store_url, f"wschat:s:{session}") or b"")
    checkpoint: dict[str, Any] = {}
    change(state, checkpoint)
    await store_set(store_url, f"wschat:s:{session}", pack(state))
    if checkpoint:
        client = aioredis.from_url(store_url)
        try:
            await client.set(f"wschat:r:{session}", pack(checkpoint), px=60_000)
        finally:
            await client.aclose()


async def reply_of(peer: RawPeer) -> tuple[dict[str, Any], list[str]]:
    """The next ``done``, and the codes of the error frames before it."""
    frames = await peer.recv_until("done")
    return frames[-1], [f["code"] for f in frames if f["type"] == "error"]


@pytest.mark.parametrize(
    "change",
    [
        out_of_vocabulary,
        checkpoint_out_of_range,
        another_engine,
        huge_last_prompt,
        foreign_kept_reply,
    ],
)
async def test_a_tampered_state_gives_a_new_session_and_its_batch_mates_finish(
    tmp_path: Path, batched3: BatchedEngine, change: Callable[..., None]
) -> None:
    async with (
        redis_server(tmp_path) as store,
        running_server(batched3, session_store=store.url) as url,
    ):
        async with raw_peer(url) as (peer, ready):
            await turn(peer, "p1", "hello there")
        await detached(store, ready["session"])
        await tamper(store.url, ready["session"], change)
        async with raw_peer(url) as (a, _), raw_peer(url) as (b, _):
            for peer in (a, b):  # replies far longer than the rest of the test
                await prompt(peer, "long", max_new_tokens=1000)
                await tokens_until(peer, 1)
            async with raw_peer(f"{url}?resume={ready['resume']}") as (peer, resumed):
                await prompt(peer, "p2", "and then?", max_new_tokens=8)
                mine = await reply_of(peer)
            for peer in (a, b):
                await peer.send({"type": "cancel", "id": "long"})
            mates = [await reply_of(peer) for peer in (a, b)]
    assert resumed["session"] != ready["session"]  # refused: a new session
    assert (mine[0]["reason"], mine[1]) == ("length", [])
    assert all(done["reason"] in ("cancelled", "length") for done, _ in mates), mates
    assert [errors for _, errors in mates] == [[], []]


async def pings_while(peer: RawPeer, until: asyncio.Event) -> float:
    """Pings one after the other until ``until`` is set; the longest a ping and its pong took,
    or a pause between them (the server shares this event loop: a stall holds up either)."""
    longest = 0.0
    while not until.is_set():
        start = time.monotonic()
        await peer.send({"type": "ping", "t": start})
        await peer.recv_until("pong")
        await asyncio.sleep(PACE_S)  # within the frame rate limit
        longest = max(longest, time.monotonic() - start - PACE_S)
    return longest


def many_exchanges(state: dict[str, Any], _: dict[str, Any]) -> None:
    state["chat"]["exchanges"] *= 600_000  # 26 MB


def many_ids(state: dict[str, Any], _: dict[str, Any]) -> None:
    exchange = state["chat"]["exchanges"][0]
    state["chat"]["exchanges"] = [{**exchange, "user": [70_000] * (1 << 16)}] * 32  # 10 MB


@contextlib.asynccontextmanager
async def tampered_session(
    tmp_path: Path, change: Callable[..., None]
) -> AsyncIterator[tuple[RedisProcess, str, dict[str, Any]]]:
    """Redis and a server on the scripted engine, where one session had a turn and was let go,
    its stored state then changed by ``change``: the store, the server's URL, that ``ready``."""
    async with (
        redis_server(tmp_path) as store,
        running_server(ScriptedEngine(), session_store=store.url) as url,
    ):
        async with raw_peer(url) as (peer, ready):
            await turn(peer, "p1", "hello there")
        await detached(store, ready["session"])
        await tamper(store.url, ready["session"], change)
        yield store, url, ready


@pytest.mark.parametrize("huge", [many_exchanges, many_ids])
async def test_a_huge_stored_state_is_checked_without_stalling_other_sessions(
    tmp_path: Path, huge: Callable[..., None]
) -> None:
    """A stored state far larger than a live session's: refused, and read and checked off the
    event loop, so another session's pings are answered meanwhile."""
    async with tampered_session(tmp_path, huge) as (_, url, ready), raw_peer(url) as (other, _):
        over = asyncio.Event()
        pinger = asyncio.create_task(pings_while(other, over))
        try:
            async with raw_peer(f"{url}?resume={ready['resume']}") as (_, resumed):
                pass
        finally:
            over.set()
        async with asyncio.timeout(TIMEOUT):
            longest = await pinger
    print(f"{huge.__name__}: other sessions' pings held up at most {longest * 1000:.0f} ms")
    assert resumed["session"] != ready["session"]
    assert longest < 1.0


OVERSIZE = 64 << 20  # a scaled-down 200 MB: over any state a live session keeps


def oversize_extra_field(state: dict[str, Any], _: dict[str, Any]) -> None:
    state["extra"] = b"x" * OVERSIZE


async def redis_output_bytes(store_url: str) -> int:
    """What Redis has sent its clients in all, from its ``INFO stats``."""
    client = aioredis.from_url(store_url)
    try:
        return int((await client.info("stats"))["total_net_output_bytes"])
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def redis_commands(store_url: str) -> AsyncIterator[list[str]]:
    """The commands Redis runs from entering to leaving, its scripts' included (``MONITOR``);
    the list is whole once the block is left."""
    client = aioredis.from_url(store_url)
    marker = f"end-{time.monotonic_ns()}"
    seen: list[str] = []
    try:
        async with client.monitor() as monitor:
            yield seen
            await client.echo(marker)
            async with asyncio.timeout(TIMEOUT):
                while (command := (await monitor.next_command())["command"]) != f"ECHO {marker}":
                    seen.append(command)
    finally:
        await client.aclose()


async def test_an_oversize_stored_state_is_refused_without_being_read(tmp_path: Path) -> None:
    """Its size is looked at in Redis before any byte of it is sent: a new session, and no
    command reads the value (which would hold Redis and the replica up while it crosses)."""
    async with tampered_session(tmp_path, oversize_extra_field) as (store, url, ready):
        before = await redis_output_bytes(store.url)
        async with (
            redis_commands(store.url) as commands,
            raw_peer(f"{url}?resume={ready['resume']}") as (_, resumed),
        ):
            pass
        sent = await redis_output_bytes(store.url) - before
    print(f"a {OVERSIZE >> 20} MiB stored state refused: Redis sent {sent} bytes meanwhile")
    assert resumed["session"] != ready["session"]
    state = f"wschat:s:{ready['session']}"
    assert [c for c in commands if c.startswith(f"GET {state}")] == []
    assert any(c.startswith("EVALSHA") for c in commands)  # the claim ran
    assert sent < 1 << 20

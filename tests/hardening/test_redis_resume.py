"""Resuming through the Redis store when things go wrong, with a real ``redis-server`` and a real
server and WebSocket clients: a reply dropped before its session was ever written, a reply that
ended with no connection (its ``done`` kept in Redis for the resume), a Redis that stalls while
a claim is under way. (States in Redis that were tampered with or are huge:
test_redis_stored_states.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from wschat.protocol import FinishReason
from wschat.server.sessions.hub import Hub
from wschat.server.sessions.redis_store import RedisSessionStore
from wschat.server.settings import Settings

from tests.fakes.scripted import Script, ScriptedEngine
from tests.prometheus import samples
from tests.sessions.test_mid_reply_resume import (
    drop,
    prompt,
    resume_url,
    token_text,
    tokens_until,
)
from tests.sessions.test_redis_replicas import (
    REDIS_SERVER,
    detached,
    redis_server,
    turn,
)
from tests.support import TIMEOUT, http_base, raw_peer, running_server

pytestmark = pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="needs redis-server")

STALL_S = 4  # DEBUG SLEEP: Redis answers nothing for this long


def slow_endless() -> ScriptedEngine:
    """A reply that goes on far past any wait here; only a cancel ends it."""
    return ScriptedEngine(lambda r: Script([f" t{i}" for i in range(100_000)], delay_s=0.02))


async def metric(url: str, name: str) -> float:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        text = (await http.get(f"{http_base(url)}/metrics")).text
    return samples(text)[name]


async def stored(store_url: str, key: str) -> bytes | None:
    client = aioredis.from_url(store_url)
    try:
        value = await client.get(key)
        assert value is None or isinstance(value, bytes)
        return value
    finally:
        await client.aclose()


# -- a reply dropped before its session's first write (issue 22, item 2) ------------------


async def test_a_reply_dropped_before_its_session_was_first_written_is_still_resumed(
    tmp_path: Path,
) -> None:
    """The session's first write fails (Redis is down) until after its connection dropped
    mid-reply: its owner key does not exist yet, which is no other replica's claim, so the reply
    goes on here and a resume gets it."""
    engine = slow_endless()
    async with (
        redis_server(tmp_path) as store,
        running_server(engine, session_store=store.url) as url,
    ):
        store.stop()
        async with raw_peer(url) as (peer, ready):
            await prompt(peer, "p1", max_new_tokens=1000)
            got = await tokens_until(peer, 1)
            drop(peer)
        async with asyncio.timeout(TIMEOUT):
            while await metric(url, "wschat_sessions_active"):
                await asyncio.sleep(0.02)  # the server sees the drop: nothing to await here
        await store.start()  # empty: the first write is the one after the drop
        state = f"wschat:s:{ready['session']}"
        async with asyncio.timeout(TIMEOUT):
            while not await stored(store.url, state) and engine.threads:
                await asyncio.sleep(0.02)  # written, or the reply was let go
        async with raw_peer(resume_url(url, ready, got[-1]["index"])) as (peer, resumed):
            assert resumed["session"] == ready["session"]
            assert resumed["resumed"] == {"last_prompt": None, "reply": "p1", "turns": 0}
            await peer.send({"type": "cancel", "id": "p1"})
            done = (await peer.recv_until("done"))[-1]
    assert done["reason"] == "cancelled"


# -- a reply that ended detached: its done kept in Redis for the resume (issue 32, EDIT-1) --


async def test_a_reply_dropped_before_its_first_token_is_resumed_from_redis_with_its_done(
    tmp_path: Path,
) -> None:
    """Cancelled at the drop (nothing to resume), the exchange kept: the resume, from the state
    in Redis, is told how the reply ended, as it is from memory (PROTOCOL.md section 10)."""
    # a token a second: the drop, right after start, comes before the first
    engine = ScriptedEngine(lambda r: Script([f" t{i}" for i in range(100)], delay_s=1.0))
    async with (
        redis_server(tmp_path) as store,
        running_server(engine, session_store=store.url) as url,
    ):
        async with raw_peer(url) as (peer, ready):
            await prompt(peer, "p1")
            assert (await peer.recv())["type"] == "start"
            drop(peer)
        await detached(store, ready["session"])  # let go here: the resume reads Redis
        async with raw_peer(resume_url(url, ready, 0)) as (peer, resumed):
            frames = await peer.recv_until("done")
    assert resumed["session"] == ready["session"]
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": "p1", "turns": 1}
    done = frames[-1]
    assert (done["type"], done["id"], done["reason"]) == ("done", "p1", "cancelled")
    # the one token the engine had under way, if any, comes before it
    assert token_text(frames) == done["text"] and done["usage"]["completion_tokens"] <= 1


async def test_a_reply_that_ended_while_held_is_replayed_from_redis_after_the_grace(
    tmp_path: Path,
) -> None:
    """It ran on to its end while held, then the session was let go to Redis: a resume naming
    the last token it got gets the rest in one frame, then the done, none of it twice."""
    engine = ScriptedEngine(lambda r: Script([f" t{i}" for i in range(40)], delay_s=0.01))
    async with (
        redis_server(tmp_path) as store,
        running_server(engine, session_store=store.url, resume_grace_s=0.5) as url,
    ):
        async with raw_peer(url) as (peer, ready):
            await prompt(peer, "p1")
            got = await tokens_until(peer, 1)
            drop(peer)
        await detached(store, ready["session"])  # the grace is over: written, let go
        async with raw_peer(resume_url(url, ready, got[0]["index"])) as (peer, resumed):
            rest = await peer.recv_until("done")
    assert resumed["resumed"] == {"last_prompt": "p1", "reply": "p1", "turns": 1}
    assert [f["type"] for f in rest] == ["token", "done"]
    assert rest[-1]["reason"] == FinishReason.STOP.value
    assert got[0]["text"] + token_text(rest) == rest[-1]["text"]
    assert rest[-1]["text"] == "".join(f" t{i}" for i in range(40))


# -- a claim that Redis runs after the resume gave up on it (item 7) -----------------------


async def redis_stalled(store_url: str) -> None:
    """Until a ping to Redis goes unanswered for a while (another client's DEBUG SLEEP)."""
    client = aioredis.from_url(store_url, socket_timeout=0.5)
    try:
        async with asyncio.timeout(TIMEOUT):
            while True:
                try:
                    await client.ping()
                except aioredis.TimeoutError:
                    return
                await asyncio.sleep(0.02)  # the sleep is not on yet: nothing to await
    finally:
        with contextlib.suppress(aioredis.RedisError, OSError):
            await client.aclose()


async def test_a_claim_redis_runs_after_the_resume_gave_up_takes_nothing(tmp_path: Path) -> None:
    async with (
        redis_server(tmp_path, options=("--enable-debug-command", "local")) as store,
        running_server(ScriptedEngine(), session_store=store.url) as url,
    ):
        async with raw_peer(url) as (peer, ready):
            await turn(peer, "p1", "hello there")
        await detached(store, ready["session"])
        async with raw_peer(f"{url}?resume=not-a-token"):
            pass  # Redis knows the claim's script from now on
        sleeper = aioredis.from_url(store.url)  # no socket timeout: it waits the sleep out
        sleep = sleeper.execute_command("DEBUG", "SLEEP", STALL_S)  # type: ignore[no-untyped-call]
        stall = asyncio.create_task(sleep)
        try:
            await redis_stalled(store.url)
            async with raw_peer(f"{url}?resume={ready['resume']}") as (_, during):
                pass  # the store gave up: a new session
            async with asyncio.timeout(TIMEOUT):
                await stall
        finally:
            await sleeper.aclose()
        async with raw_peer(f"{url}?resume={ready['resume']}") as (_, after):
            pass
    assert during["session"] != ready["session"]
    assert after["session"] == ready["session"]


async def test_a_claim_past_its_deadline_on_redis_clock_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As if Redis ran the claim's script long after its ``TIME``: refused, the token kept."""
    async with redis_server(tmp_path) as store:
        hub = Hub(Settings(session_store=store.url))
        hub.set_engine(ScriptedEngine())
        session = hub.new_session()
        token = await hub.sessions.add(session)
        await hub.sessions.detach(session)
        await detached(store, session.key)
        assert isinstance(hub.sessions, RedisSessionStore)
        client = hub.sessions.client
        now = client.time

        async def ten_seconds_ago() -> tuple[int, int]:
            seconds, micros = await now()
            return seconds - 10, micros

        try:
            monkeypatch.setattr(client, "time", ten_seconds_ago)
            late = await hub.sessions.claim(token)
            monkeypatch.setattr(client, "time", now)
            claimed = await hub.sessions.claim(token)
        finally:
            await hub.sessions.aclose()
    assert late.session is None and late.unavailable is not None
    assert claimed.session is not None and claimed.session.key == session.key

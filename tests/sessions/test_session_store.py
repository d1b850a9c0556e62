"""``MemorySessionStore``: detached sessions are kept for resumption, bounded in time and number;
a claim waits (bounded) for a session's connection to end; ``Hub.end_connection`` closes the
sessions it does not keep."""

from __future__ import annotations

import asyncio

from wschat.protocol import Prompt
from wschat.server.sessions.hub import Hub
from wschat.server.sessions.session import Session
from wschat.server.sessions.states import SessionState
from wschat.server.sessions.store import MemorySessionStore
from wschat.server.settings import Settings

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, wait_until


def session(key: str) -> Session:
    return Hub(Settings(), ScriptedEngine()).new_session(key)


async def detached(store: MemorySessionStore, key: str) -> str:
    token = await store.add(session(key))
    await store.detach(store.live[key])
    return token


async def test_churn_keeps_at_most_max_detached_sessions_dropping_the_oldest() -> None:
    store = MemorySessionStore(resume_window_s=120, max_detached=3)
    tokens = [await detached(store, f"s{i}") for i in range(5)]
    dropped = store.expire()
    assert [s.key for s in dropped] == ["s0", "s1"]
    assert store.detached_count == 3
    assert (await store.claim(tokens[0])).session is None
    claimed = (await store.claim(tokens[4])).session
    assert claimed is not None and claimed.key == "s4"


async def test_a_session_past_its_window_cannot_be_claimed_and_expires() -> None:
    now = [1000.0]
    store = MemorySessionStore(resume_window_s=10.0, clock=lambda: now[0])
    token = await detached(store, "s")
    now[0] += 9.5
    assert store.expire() == []
    now[0] += 0.5
    assert (await store.claim(token)).session is None
    assert [s.key for s in store.expire()] == ["s"]
    assert store.detached_count == 0


async def test_without_a_window_nothing_is_kept() -> None:
    store = MemorySessionStore(resume_window_s=0.0)
    assert (await store.claim(await detached(store, "s"))).session is None
    assert store.detached_count == 0


async def test_a_closed_session_is_not_kept_for_resumption() -> None:
    store = MemorySessionStore(resume_window_s=120)
    closed = session("s")
    await closed.close()  # as a shutdown leaves it
    await store.add(closed)
    assert await store.detach(closed) is False
    assert store.detached_count == 0


async def test_ending_a_connection_without_a_resume_window_closes_its_session() -> None:
    hub = Hub(Settings(resume_window_s=0.0))
    hub.set_engine(ScriptedEngine())
    ended = hub.new_session()
    await hub.sessions.add(ended)
    await hub.end_connection(ended)
    assert ended.state is SessionState.CLOSED


async def test_a_detached_session_is_closed_when_its_window_expires() -> None:
    hub = Hub(Settings(resume_window_s=10.0))
    hub.set_engine(ScriptedEngine())
    now = [1000.0]
    assert isinstance(hub.sessions, MemorySessionStore)
    hub.sessions.clock = lambda: now[0]
    first, second = hub.new_session(), hub.new_session()
    for s in (first, second):
        await hub.sessions.add(s)
    await hub.end_connection(first)
    assert first.state is SessionState.IDLE  # kept for a resume
    now[0] += 10.0
    await hub.end_connection(second)  # any connection's end expires the old ones
    assert (first.state, second.state) == (SessionState.CLOSED, SessionState.IDLE)


async def test_a_claim_of_a_connected_session_waits_for_its_connection_to_end() -> None:
    store = MemorySessionStore(resume_window_s=120)
    held = session("s")
    token = await store.add(held)
    claim = asyncio.create_task(store.claim(token))
    await asyncio.sleep(0)  # the claim is waiting: the connection has not ended yet
    assert not claim.done()
    await store.detach(held)  # a drop the server saw after the client reconnected
    async with asyncio.timeout(TIMEOUT):
        assert (await claim).session is held


async def test_a_claim_of_a_session_that_stays_connected_gets_a_new_one() -> None:
    store = MemorySessionStore(resume_window_s=120, handover_s=0.01)
    token = await store.add(session("s"))
    assert (await store.claim(token)).session is None
    assert "s" in store.live  # the connection keeps it, and its token


async def test_stopping_held_replies_cancels_a_reply_that_goes_on_without_a_connection() -> None:
    """What a shutdown does (runtime/shutdown.py): nobody is left to resume it."""
    hub = Hub(Settings())
    hub.set_engine(ScriptedEngine(lambda r: Script([" t"] * 100_000, delay_s=0.005)))
    held = hub.new_session()
    await hub.sessions.add(held)
    await held.handle(Prompt("p", "go"))
    # a reply that has sent a token: one with none yet is cancelled at once by a drop
    await wait_until(lambda: held.run is not None and held.run.first_token_at is not None)
    await held.disconnect(grace_s=600)  # dropped: the reply goes on
    await hub.end_connection(held)
    assert held.state is SessionState.RUNNING_DETACHED
    await hub.stop_held_replies()
    assert (held.state, held.core.last_prompt) == (SessionState.IDLE, "p")  # cancelled, and kept
    await hub.aclose()

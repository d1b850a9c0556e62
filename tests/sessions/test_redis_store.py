"""``RedisSessionStore`` in this process against a real ``redis-server``: a session's state
round-trips through its snapshot, a resume needs the server's credentials before its token is
even looked at, state that is not a snapshot is refused, and closing the store writes what is
pending first (bounded while Redis is down)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import websockets
from wschat.server.sessions.hub import Hub
from wschat.server.sessions.snapshot import SnapshotError, pack, unpack
from wschat.server.settings import Settings

from tests.fakes.scripted import ScriptedEngine
from tests.sessions.test_redis_replicas import REDIS_SERVER, detached, redis_server, turn
from tests.support import TIMEOUT, raw_peer, running_server

pytestmark = pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="needs redis-server")


def test_a_snapshot_keeps_arrays_exactly_and_refuses_bytes_that_are_not_one() -> None:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    state = {"chat": {"exchanges": [{"images": [image], "reply": [1, 2, 3]}]}, "ids": ["a"]}
    back = unpack(pack(state))
    kept = back["chat"]["exchanges"][0]["images"][0]
    assert kept.dtype == image.dtype and kept.shape == image.shape and (kept == image).all()
    assert back["ids"] == ["a"] and back["chat"]["exchanges"][0]["reply"] == [1, 2, 3]
    with pytest.raises(SnapshotError):
        unpack(b"\x93\x01\x02")  # msgpack, but not a snapshot


async def test_with_a_token_set_a_resume_needs_the_credentials_and_keeps_its_token(
    tmp_path: Path,
) -> None:
    async with (
        redis_server(tmp_path) as store,
        running_server(ScriptedEngine(), session_store=store.url, tokens=("secret",)) as url,
    ):
        auth = {"additional_headers": {"Authorization": "Bearer secret"}}
        async with raw_peer(url, **auth) as (peer, ready):
            await turn(peer, "p1", "hello")
        await detached(store, ready["session"])
        with pytest.raises(websockets.InvalidStatus):  # refused at the handshake
            async with raw_peer(f"{url}?resume={ready['resume']}"):
                pass
        async with raw_peer(f"{url}?resume={ready['resume']}", **auth) as (_, resumed):
            assert resumed["session"] == ready["session"]


async def test_closing_the_store_writes_a_just_detached_session_first(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as store:
        hub = Hub(Settings(session_store=store.url))
        hub.set_engine(ScriptedEngine())
        session = hub.new_session()
        token = await hub.sessions.add(session)
        assert await hub.sessions.detach(session)
        await hub.sessions.aclose()  # at once: the write is still pending
        other = Hub(Settings(session_store=store.url))
        other.set_engine(ScriptedEngine())
        try:
            claim = await other.sessions.claim(token)
        finally:
            await other.sessions.aclose()
        assert claim.session is not None and claim.session.key == session.key


async def test_closing_the_store_gives_up_on_writes_while_redis_is_down(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as store:
        hub = Hub(Settings(session_store=store.url))
        hub.set_engine(ScriptedEngine())
        store.stop()
        session = hub.new_session()
        await hub.sessions.add(session)
        assert await hub.sessions.detach(session)
        async with asyncio.timeout(TIMEOUT):
            await hub.sessions.aclose()  # within FLUSH_S and one Redis timeout
        assert hub.sessions.errors > 0

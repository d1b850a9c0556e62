"""``RedisSessionStore`` in this process against a real ``redis-server``: a session's state
round-trips through its snapshot, a resume needs the server's credentials before its token is
even looked at, and state that is not a snapshot is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import websockets
from wschat.server.sessions.snapshot import SnapshotError, pack, unpack

from tests.fakes.scripted import ScriptedEngine
from tests.sessions.test_redis_replicas import REDIS_SERVER, detached, redis_server, turn
from tests.support import raw_peer, running_server

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

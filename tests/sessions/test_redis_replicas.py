"""Sessions in Redis (``--session-store redis://``): two real gateway processes on the tiny
dev model and a real ``redis-server``, all on loopback ports, started and stopped by their pids.

A conversation begun on one replica resumes on the other (same session, the next turn's prompt
continuing it); a token is single-use, also when two clients race it; a session a connection
still holds cannot be claimed; AOF keeps sessions over a Redis restart; with Redis down, live
sessions stream on, a resume says it is unavailable (a new session), the store errors are
counted, and everything works again once Redis is back, without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from wschat.server.sessions.snapshot import unpack

from tests.support import (
    ROOT,
    TIMEOUT,
    RawPeer,
    command_until_ready,
    free_port,
    http_base,
    raw_peer,
)

from .test_mid_reply_resume import drop, prompt, resume_url, token_text, tokens_until

REDIS_SERVER = "/usr/bin/redis-server"
LEASE_S = 3.0
LONG = "Tell me a long story about the sea."
RUNNING = "wschat_generations_running "
pytestmark = pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="needs redis-server")


@dataclass
class RedisProcess:
    port: int
    folder: Path
    aof: bool
    process: subprocess.Popen[bytes] | None = None
    options: tuple[str, ...] = ()  # more of redis-server's options

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else []
        command = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *persistence,
            *self.options,
            "--dir",
            str(self.folder),
        ]
        with (self.folder / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        client = aioredis.from_url(self.url)
        try:
            async with asyncio.timeout(TIMEOUT):
                while True:  # another process: nothing to await but its answer
                    assert self.process.poll() is None, (self.folder / "redis.log").read_text()
                    with contextlib.suppress(OSError, aioredis.ConnectionError):
                        if await client.ping():
                            return
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # AOF: a clean stop, as a restart does
            self.process.wait(TIMEOUT)
        self.process = None


@contextlib.asynccontextmanager
async def redis_server(
    folder: Path, *, aof: bool = False, options: tuple[str, ...] = ()
) -> AsyncIterator[RedisProcess]:
    server = RedisProcess(free_port(), folder, aof, options=options)
    await server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def gateway(model: Path, store: str, log: Path) -> AsyncIterator[str]:
    """``python -m wschat.server`` on the tiny model with ``--session-store store``."""
    async with gateway_process(model, store, log) as (_, url):
        yield url


@contextlib.asynccontextmanager
async def gateway_process(
    model: Path, store: str, log: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """``gateway``, and its process (a test may kill it)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "wschat.server",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--threads",
        "1",
        "--session-store",
        store,
        "--session-lease-s",
        str(LEASE_S),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with command_until_ready(command, port, log, env, 120.0, cwd=ROOT) as process:
        yield process, f"ws://127.0.0.1:{port}/v1/chat"


@contextlib.asynccontextmanager
async def replicas(
    tmp_path: Path, model: Path, *, aof: bool = False
) -> AsyncIterator[tuple[RedisProcess, str, str]]:
    """Redis and two gateways on it, ``a`` and ``b``, started side by side (a start is mostly a
    fresh interpreter importing torch and transformers: one core each)."""
    async with redis_server(tmp_path, aof=aof) as store, contextlib.AsyncExitStack() as stack:
        # a failed start cancels the other, which kills its process; a started one is on the stack
        async with asyncio.TaskGroup() as group:
            started = [
                group.create_task(
                    stack.enter_async_context(gateway(model, store.url, tmp_path / f"{name}.log"))
                )
                for name in ("a", "b")
            ]
        a, b = (task.result() for task in started)
        yield store, a, b


async def turn(peer: RawPeer, id: str, text: str, max_new_tokens: int = 8) -> dict[str, Any]:
    """One prompt to its ``done``."""
    params = {"max_new_tokens": max_new_tokens}
    await peer.send({"type": "prompt", "id": id, "text": text, "params": params})
    frames = await peer.recv_until("done")
    return frames[-1]


async def detached(store: RedisProcess, session: str) -> None:
    """Until the replica that held ``session`` let it go: its state is stored and its owner key
    is gone. (An owner key alone can be absent before anything was written: a replica whose
    write waits out a backoff writes a session added and detached meanwhile once, as detached.)
    """
    client = aioredis.from_url(store.url)
    state, owner = f"wschat:s:{session}", f"wschat:o:{session}"
    try:
        async with asyncio.timeout(TIMEOUT):
            while not await client.exists(state) or await client.exists(owner):
                await asyncio.sleep(0.02)  # another process: nothing to await
    finally:
        await client.aclose()


async def left_on(url: str, store: RedisProcess) -> tuple[str, str, dict[str, Any]]:
    """A conversation of one turn begun at ``url`` and left: its session, its resume token and
    the first turn's ``done``."""
    async with raw_peer(url) as (peer, ready):
        done = await turn(peer, "p1", "hello there")
    await detached(store, ready["session"])
    return ready["session"], ready["resume"], done


async def store_errors(url: str) -> float:
    base = url.replace("ws://", "http://").removesuffix("/v1/chat")
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        text = (await http.get(f"{base}/metrics")).text
    for line in text.splitlines():
        if line.startswith("wschat_session_store_errors_total "):
            return float(line.split()[1])
    raise AssertionError("no wschat_session_store_errors_total in /metrics")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_cluster(
    tmp_path_factory: pytest.TempPathFactory, tiny_text_dir: Path
) -> AsyncIterator[tuple[RedisProcess, str, str]]:
    async with replicas(tmp_path_factory.mktemp("cluster"), tiny_text_dir) as parts:
        yield parts


@pytest.fixture
def cluster(shared_cluster: tuple[RedisProcess, str, str]) -> tuple[RedisProcess, str, str]:
    """Redis and two replicas, shared by this module's tests (each test's sessions are its own):
    a test that stops or kills a part starts its own with ``replicas`` or ``gateway_process``."""
    store, _, _ = shared_cluster
    assert store.process is not None and store.process.poll() is None, "the shared Redis stopped"
    return shared_cluster


async def test_a_conversation_begun_on_one_replica_continues_on_the_other(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    store, a, b = cluster
    # the same two turns without moving, for the prompt the second turn must have
    async with raw_peer(a) as (peer, _):
        await turn(peer, "p1", "hello there")
        unmoved = await turn(peer, "p2", "and again")
    session, token, first = await left_on(a, store)
    async with raw_peer(f"{b}?resume={token}") as (peer, ready):
        assert ready["session"] == session
        second = await turn(peer, "p2", "and again")
        refused = await turn_refused(peer, "p1")
    assert first["usage"]["prompt_tokens"] < second["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens"] == unmoved["usage"]["prompt_tokens"]
    assert second["text"] == unmoved["text"]
    assert (refused["code"], refused["id"]) == ("invalid_params", "p1")


async def turn_refused(peer: RawPeer, id: str) -> dict[str, Any]:
    await peer.send({"type": "prompt", "id": id, "text": "again?"})
    frames = await peer.recv_until("error")
    return frames[-1]


async def test_a_resume_token_is_good_once_across_replicas(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    store, a, b = cluster
    session, token, _ = await left_on(a, store)
    async with raw_peer(f"{b}?resume={token}") as (_, ready):
        assert ready["session"] == session
    await detached(store, session)
    async with raw_peer(f"{a}?resume={token}") as (_, again):
        assert again["session"] != session


async def test_of_two_clients_racing_one_token_exactly_one_gets_the_session(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    store, a, b = cluster
    session, token, _ = await left_on(a, store)
    async with (
        raw_peer(f"{a}?resume={token}") as (_, on_a),
        raw_peer(f"{b}?resume={token}") as (_, on_b),
    ):
        assert sorted([on_a["session"] == session, on_b["session"] == session]) == [False, True]


async def test_a_token_whose_connection_is_still_open_gives_a_new_session(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    store, a, b = cluster
    async with raw_peer(a) as (owner, ready):
        await turn(owner, "p1", "hello there")
        async with raw_peer(f"{b}?resume={ready['resume']}") as (_, other):
            assert other["session"] != ready["session"]
        await turn(owner, "p2", "still here")  # the owner goes on
    await detached(store, ready["session"])
    async with raw_peer(f"{b}?resume={ready['resume']}") as (_, later):
        assert later["session"] == ready["session"]  # the refused try did not use the token


async def test_a_session_survives_a_redis_restart_with_aof(
    tmp_path: Path, tiny_text_dir: Path
) -> None:
    async with replicas(tmp_path, tiny_text_dir, aof=True) as (store, a, b):
        session, token, _ = await left_on(a, store)
        store.stop()
        await store.start()
        async with raw_peer(f"{b}?resume={token}") as (peer, ready):
            assert ready["session"] == session
            await turn(peer, "p2", "after the restart")


async def test_with_redis_down_sessions_stream_on_resume_is_refused_and_it_recovers(
    tmp_path: Path, tiny_text_dir: Path
) -> None:
    async with replicas(tmp_path, tiny_text_dir) as (store, a, b):
        session, token, _ = await left_on(a, store)
        async with raw_peer(a) as (live, _):
            await live.send(
                {"type": "prompt", "id": "long", "text": "go", "params": {"max_new_tokens": 64}}
            )
            await live.recv_until("token")
            store.stop()
            done = (await live.recv_until("done"))[-1]
            assert (done["reason"], done["usage"]["completion_tokens"]) == ("length", 64)
            async with raw_peer(f"{b}?resume={token}") as (_, refused):
                assert refused["session"] != session
            assert await store_errors(b) > 0
            async with httpx.AsyncClient(timeout=TIMEOUT) as http:
                ready_url = b.replace("ws://", "http://").replace("/v1/chat", "/readyz")
                assert (await http.get(ready_url)).status_code == 200
            await store.start()  # empty: no persistence
            await turn(live, "after", "redis is back")
        # a conversation left now resumes on the other replica, no restart in between
        session, token, _ = await left_on(a, store)
        async with raw_peer(f"{b}?resume={token}") as (_, resumed):
            assert resumed["session"] == session


async def reply_checkpoint(store: RedisProcess, session: str, at_least: int) -> list[int]:
    """The checkpointed tokens of ``session``'s running reply, once there are ``at_least``."""
    client = aioredis.from_url(store.url)
    try:
        async with asyncio.timeout(TIMEOUT):
            while True:
                data = await client.get(f"wschat:r:{session}")
                if isinstance(data, bytes) and data and len(ids := unpack(data)["ids"]) >= at_least:
                    return list(ids)
                await asyncio.sleep(0.05)  # another process writes it: nothing to await
    finally:
        await client.aclose()


async def generations_running(url: str) -> float:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        text = (await http.get(f"{http_base(url)}/metrics")).text
    return float(next(ln for ln in text.splitlines() if ln.startswith(RUNNING)).split()[1])


async def test_a_replica_killed_mid_reply_leaves_its_partial_reply_as_a_cancelled_exchange(
    tmp_path: Path, tiny_text_dir: Path
) -> None:
    async with (
        redis_server(tmp_path) as store,
        gateway_process(tiny_text_dir, store.url, tmp_path / "a.log") as (a_process, a),
        gateway(tiny_text_dir, store.url, tmp_path / "b.log") as b,
    ):
        async with raw_peer(a) as (peer, ready):
            await turn(peer, "p1", "hello there")
            await prompt(peer, "p2", LONG, max_new_tokens=1000)
            got = await tokens_until(peer, 1)
            partial = await reply_checkpoint(store, ready["session"], 4)
            a_process.kill()  # SIGKILL, mid-reply
            a_process.wait(TIMEOUT)
        # B waits for A's lease to lapse rather than starting a new session
        async with raw_peer(resume_url(b, ready, got[-1]["index"])) as (peer, resumed):
            after = await turn(peer, "p3", "and then?")
        # the same conversation on B in one go, the second reply cut where the checkpoint was
        async with raw_peer(b) as (peer, _):
            await turn(peer, "p1", "hello there")
            cut = await turn(peer, "p2", LONG, max_new_tokens=len(partial))
            unbroken = await turn(peer, "p3", "and then?")
    assert resumed["session"] == ready["session"]
    assert resumed["resumed"] == {
        "last_prompt": "p2",
        "reply": None,
        "turns": 2,
    }  # the reply was lost
    assert (cut["reason"], cut["usage"]["completion_tokens"]) == ("length", len(partial))
    assert after["usage"]["prompt_tokens"] == unbroken["usage"]["prompt_tokens"]
    assert after["text"] == unbroken["text"]


async def test_a_reply_dropped_mid_stream_resumes_on_its_replica_and_elsewhere_is_cancelled(
    cluster: tuple[RedisProcess, str, str],
) -> None:
    _, a, b = cluster
    async with raw_peer(a) as (peer, ready):
        await prompt(peer, "p1", LONG, max_new_tokens=1000)
        got = await tokens_until(peer, 2)
        drop(peer)
    # back on the replica that goes on with the reply: every token, once
    async with raw_peer(resume_url(a, ready, got[0]["index"])) as (peer, again):
        rest = await tokens_until(peer, 2)
        await peer.send({"type": "cancel"})
        rest += await peer.recv_until("done")
        await prompt(peer, "p2", LONG, max_new_tokens=1000)
        await tokens_until(peer, 1)
        drop(peer)
    # this time the resume lands on the other replica: the reply is lost there, kept as
    # cancelled, and the replica that held it stops it
    async with raw_peer(resume_url(b, again, None)) as (peer, elsewhere):
        nxt = await turn(peer, "p3", "and then?")
    async with asyncio.timeout(TIMEOUT):
        while await generations_running(a):
            await asyncio.sleep(0.05)  # another process: nothing to await but its /metrics
    assert again["resumed"] == {"last_prompt": None, "reply": "p1", "turns": 0}
    assert got[0]["text"] + token_text(rest) == rest[-1]["text"]
    assert rest[-1]["reason"] == "cancelled"
    assert elsewhere["session"] == ready["session"]
    assert elsewhere["resumed"] == {"last_prompt": "p2", "reply": None, "turns": 2}
    assert nxt["reason"] in ("length", "stop")

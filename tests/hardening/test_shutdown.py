"""SIGTERM with live generations, on the real ``serve`` in a subprocess: ``goaway``, no new
prompts, ``/readyz`` 503 ``draining``, running replies finish within the grace period or end
``cancelled``, close 1001, exit 0; with a shared session store (Redis), each session is left
there for another replica to resume."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.fakes.scripted import ScriptedEngine
from tests.sessions.test_redis_replicas import REDIS_SERVER, redis_server, turn, turn_refused
from tests.support import TIMEOUT, RawPeer, http_base, raw_peer, running_server, server_process


async def frames_until_closed(peer: RawPeer) -> tuple[list[dict[str, Any]], int | None]:
    frames = []
    try:
        while True:
            frames.append(await peer.recv())
    except websockets.ConnectionClosed as closed:
        return frames, closed.rcvd.code if closed.rcvd else None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_drains_live_generations_then_exits_0(
    sig: signal.Signals, tmp_path: Path
) -> None:
    async with (
        server_process(tmp_path / "server.log") as (proc, url),
        raw_peer(url) as (short, _),
        raw_peer(url) as (long, _),
        raw_peer(url) as (idle, _),
    ):
        await long.send({"type": "prompt", "id": "L", "text": "a long one"})
        await short.send({"type": "prompt", "id": "S", "text": "a short one"})
        await long.recv_until("token")
        await short.recv_until("token")
        proc.send_signal(sig)
        goaway = await idle.recv()
        assert goaway["type"] == "goaway"
        assert goaway["in_ms"] == 2000
        await idle.send({"type": "prompt", "id": "late", "text": "too late"})
        refused = await idle.recv()
        assert (refused["type"], refused["code"], refused["id"]) == ("error", "overloaded", "late")
        assert "shutting down" in refused["message"]
        short_frames, short_code = await frames_until_closed(short)
        long_frames, long_code = await frames_until_closed(long)
        idle_frames, idle_code = await frames_until_closed(idle)
        async with asyncio.timeout(TIMEOUT):
            returncode = await asyncio.to_thread(proc.wait)
    short_done = [f for f in short_frames if f["type"] == "done"]
    long_done = [f for f in long_frames if f["type"] == "done"]
    assert "goaway" in [f["type"] for f in short_frames]
    assert short_done[0]["reason"] == "stop"  # it finished within the grace period
    assert short_done[0]["text"] == "".join(f" s{i}" for i in range(10))
    assert long_done[0]["reason"] == "cancelled"  # it could not, and was cut with a done
    assert "goaway" in [f["type"] for f in long_frames]
    assert (short_code, long_code, idle_code) == (1001, 1001, 1001)
    assert idle_frames == []
    assert returncode == 0, (tmp_path / "server.log").read_text()


async def exit_status(proc: subprocess.Popen[bytes]) -> int:
    async with asyncio.timeout(TIMEOUT):
        return await asyncio.to_thread(proc.wait)


async def test_a_draining_server_answers_readyz_503_draining(tmp_path: Path) -> None:
    async with server_process(tmp_path / "server.log") as (proc, url), raw_peer(url) as (long, _):
        await long.send({"type": "prompt", "id": "L", "text": "a long one"})
        await long.recv_until("token")
        proc.send_signal(signal.SIGTERM)
        await long.recv_until("goaway")
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            answer = await http.get(f"{http_base(url)}/readyz")
        assert answer.status_code == 503
        assert answer.json() == {"ready": False, "status": "draining"}
        _, code = await frames_until_closed(long)
        assert (code, await exit_status(proc)) == (1001, 0)


@pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="needs redis-server")
async def test_with_a_shared_store_a_drained_session_resumes_on_another_replica(
    tmp_path: Path,
) -> None:
    async with redis_server(tmp_path) as store:
        options = ("--session-store", store.url)
        async with server_process(tmp_path / "server.log", *options) as (proc, url):
            async with raw_peer(url) as (peer, ready):
                await turn(peer, "S", "a short one")
                await peer.send({"type": "prompt", "id": "L", "text": "a long one"})
                await peer.recv_until("token")
                proc.send_signal(signal.SIGTERM)
                frames, code = await frames_until_closed(peer)
            assert (code, await exit_status(proc)) == (1001, 0)
        assert [f["reason"] for f in frames if f["type"] == "done"] == ["cancelled"]
        engine = ScriptedEngine()
        async with (
            running_server(engine, session_store=store.url) as other,
            raw_peer(f"{other}?resume={ready['resume']}") as (peer, resumed),
        ):
            assert resumed["session"] == ready["session"]
            assert (await turn_refused(peer, "L"))["code"] == "invalid_params"
            await turn(peer, "next", "go on")
    # both replies are in the conversation, the one the drain cut as far as it went
    (request,) = engine.requests
    replies = [i for i in request.prompt_ids if 1000 <= i < 2200]  # the scripted reply ids
    short, partial = replies[:10], replies[10:]
    assert short == list(range(1000, 1010))
    assert partial and partial == list(range(1000, 1000 + len(partial)))

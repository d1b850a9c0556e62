"""SIGTERM with live generations, on the real ``serve`` in a subprocess: ``goaway``, no new
prompts, running replies finish within the grace period or end ``cancelled``, close 1001,
exit 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import websockets

from tests.support import TIMEOUT, RawPeer, raw_peer, server_process


async def frames_until_closed(peer: RawPeer) -> tuple[list[dict], int | None]:
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

"""A client that stops reading for good: its generation is cancelled and its slot freed once the
send buffer has stayed full for ``--send-timeout-s``, its connection is dropped, and a shutdown
does not wait for it past the grace period."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
import websockets

from tests.fakes.scripted import ScriptedEngine
from tests.hardening.scripted_server import script
from tests.support import ZombiePeer, raw_peer, running_server, server_process, zombie_peer

SEND_TIMEOUT_S = 1.0
# the flood's 20 MB take 2 s to produce, and the zombie's buffers fill long before; a slot
# held past this is held for good
HELD_BOUND_S = 15.0


async def stop_reading_mid_flood(zombie: ZombiePeer) -> None:
    """Start a reply of 20 MB (``scripted_server.script``), read its first token, stop."""
    await zombie.send({"type": "prompt", "id": "z", "text": "flood"})
    await zombie.recv_until("token")


async def test_a_client_that_stops_reading_loses_its_generation_and_the_queue_moves_on() -> None:
    engine = ScriptedEngine(script)
    async with (
        running_server(engine, max_concurrent=1, send_timeout_s=SEND_TIMEOUT_S) as url,
        zombie_peer(url) as zombie,
        raw_peer(url) as (other, _),
    ):
        await stop_reading_mid_flood(zombie)
        stopped_at = time.monotonic()
        await other.send({"type": "prompt", "id": "o", "text": "short"})
        frames = await other.recv_until("done", timeout=HELD_BOUND_S)
        held_s = time.monotonic() - stopped_at
        print(f"zombie reader: the only slot was freed {held_s:.1f} s after its client stopped")
        assert frames[-1]["reason"] == "stop"
        assert frames[-1]["text"] == "".join(f" s{i}" for i in range(10))
        await zombie.wait_closed_by_server()


async def test_shutdown_does_not_wait_for_a_client_that_stops_reading(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    # a send timeout longer than the test: only the shutdown deadline can end the zombie
    options = ("--shutdown-grace-s", "1", "--send-timeout-s", "600")
    async with (
        server_process(log, *options) as (proc, url),
        zombie_peer(url) as zombie,
        raw_peer(url) as (idle, _),
    ):
        await stop_reading_mid_flood(zombie)
        await asyncio.sleep(3.0)  # the flood is over: every send to the zombie is blocked
        proc.send_signal(signal.SIGTERM)
        signalled_at = time.monotonic()
        assert (await idle.recv())["type"] == "goaway"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await idle.recv(timeout=HELD_BOUND_S)
        async with asyncio.timeout(HELD_BOUND_S):
            returncode = await asyncio.to_thread(proc.wait)
        exit_s = time.monotonic() - signalled_at
        print(f"shutdown with a zombie reader: exited {exit_s:.1f} s after SIGTERM")
        await zombie.wait_closed_by_server()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1001, "a healthy client is closed as usual"
    assert returncode == 0, log.read_text()

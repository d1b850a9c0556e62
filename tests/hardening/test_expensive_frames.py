"""Frames that are cheap to send but dear to handle do not stall other clients.

The server runs in a process of its own (the real CLI on the tiny model), so that the clients'
own timing is not held up by the server's work. A flooding client sends frames the server
refuses, one after another; meanwhile another client's ``ping`` must come back in a small part of
the time one such frame would hold the event loop (the cost is measured in the test, so nothing
here is a fixed wall-clock figure). The mean round trip is what is bounded: a ping that arrives
while the loop is held waits for the rest of that frame's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel

from tests.support import TIMEOUT, RawPeer, free_port, raw_peer, wait_ready

ROOT = Path(__file__).resolve().parents[2]
PINGS = 20
PING_GAP_S = 0.03  # spreads the samples over the flood
FLOOD_GAP_S = 0.025  # keeps the flood under the frame-rate limit (50 a second)
# A 258 kB prompt that compresses to a few hundred bytes and is far over max_prompt_tokens
FLOOD_TEXT = "flood " * 43_000


def nested_ping(levels: int) -> bytes:
    """A ping whose ``t`` is a tree of arrays, 16 to a level, over arrays of 10 small ints."""
    tree = b"\x9a" + b"\x00" * 10
    for _ in range(levels):
        tree = b"\xdc\x00\x10" + tree * 16
    return b"\x82\xa4type\xa4ping\xa1t" + tree


@pytest.fixture(scope="module")
def server_url(tiny_text_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``wschat-server`` on the tiny model, default limits, in a process stopped by its pid."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--model", str(tiny_text_dir), "--port", str(port), "--ping-interval-s", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as sink:
        command = [sys.executable, "-m", "wschat.server", *args]
        proc = subprocess.Popen(command, env=env, stderr=sink)
    try:
        asyncio.run(wait_ready(proc, port, log, timeout=120))
        yield f"ws://127.0.0.1:{port}/v1/chat"
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)


def cost_s(work: Callable[[], Any]) -> float:
    """The shortest of three runs of ``work``: what one frame would hold the loop for."""
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        runs.append(time.perf_counter() - started)
    return min(runs)


@contextlib.asynccontextmanager
async def flooding(url: str, frame: bytes) -> AsyncIterator[list[dict[str, Any]]]:
    """One client sending ``frame`` again and again; yields the answers it gets."""
    answers: list[dict[str, Any]] = []
    answered = asyncio.Event()

    async def flood() -> None:
        async with raw_peer(url, compression=None, max_size=None) as (peer, _):
            while True:
                await peer.ws.send(frame)
                answers.append(await peer.recv())
                answered.set()
                await asyncio.sleep(FLOOD_GAP_S)

    task = asyncio.create_task(flood())
    try:
        async with asyncio.timeout(TIMEOUT):
            await answered.wait()
        yield answers
        assert not task.done(), task.result()  # the flood went on the whole time
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def ping_round_trips(peer: RawPeer) -> list[float]:
    times = []
    for i in range(PINGS):
        started = time.perf_counter()
        await peer.send({"type": "ping", "t": i})
        assert await peer.recv() == {"type": "pong", "t": i}
        times.append(time.perf_counter() - started)
        await asyncio.sleep(PING_GAP_S)
    return times


async def test_a_flood_of_prompts_over_the_token_limit_does_not_stall_another_clients_ping(
    server_url: str, tiny_text_loaded: LoadedModel
) -> None:
    engine = HFEngine(tiny_text_loaded)  # the server's tokenizer, to measure what one prompt costs
    cost = cost_s(lambda: engine.tokenize_text(FLOOD_TEXT))
    prompt = msgpack.packb({"type": "prompt", "id": "p", "text": FLOOD_TEXT})
    async with raw_peer(server_url) as (peer, _), flooding(server_url, prompt) as answers:
        times = await ping_round_trips(peer)
    print(f"tokenizing one prompt: {cost * 1000:.0f} ms; ping under the flood:", _ms(times))
    assert {(a["type"], a.get("code")) for a in answers} == {("error", "too_large")}
    assert statistics.mean(times) < cost / 4


async def test_a_flood_of_pings_holding_many_values_does_not_stall_another_clients_ping(
    server_url: str,
) -> None:
    frame = nested_ping(4)  # 734 kB holding 750,000 values (a few kB compressed)
    cost = cost_s(lambda: msgpack.unpackb(frame))
    async with raw_peer(server_url) as (peer, _), flooding(server_url, frame) as answers:
        times = await ping_round_trips(peer)
    print(f"decoding one frame: {cost * 1000:.0f} ms; ping under the flood:", _ms(times))
    assert {(a["type"], a.get("code")) for a in answers} == {("error", "too_large")}
    assert statistics.mean(times) < cost / 4


def _ms(times: list[float]) -> str:
    mean, top = statistics.mean(times) * 1000, max(times) * 1000
    return f"mean {mean:.1f} ms, max {top:.1f} ms over {len(times)} pings"

"""A bounded load on loopback: 200 connections open, 20 of them generating, and 1,000 cycles of
connect / prompt / disconnect churn (some closing mid-stream) beside them. No unexpected error,
and no thread or memory left growing once it ends."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import random
import threading
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import psutil
from wschat.server.engine import GenerationRequest

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import RawPeer, generation_threads, raw_peer, running_server, wait_until

CONNECTIONS = 200
GENERATING = 20
CYCLES = 1000
CHURN_WORKERS = 8


def script(request: GenerationRequest) -> Script:
    n = request.params.max_new_tokens
    return Script([f" w{i}" for i in range(n)], delay_s=0.002, end_with_eos=False)


async def generate(peer: RawPeer, frame_id: str, n: int) -> dict[str, Any]:
    await peer.send(
        {"type": "prompt", "id": frame_id, "text": "load", "params": {"max_new_tokens": n}}
    )
    frames = await peer.recv_until("done")
    done = frames[-1]
    assert done["text"] == "".join(f["text"] for f in frames if f["type"] == "token")
    return done


async def churn(url: str, rng: random.Random, cycles: int, seen: Counter[str]) -> None:
    for i in range(cycles):
        # max_queue=None: a client closing mid-stream must still read the server's close reply
        # behind the token frames it no longer wants
        async with raw_peer(url, max_queue=None) as (peer, _):
            if rng.random() < 0.3:  # leave mid-stream: a close, or the TCP connection dropped
                await peer.send({"type": "prompt", "id": f"c{i}", "text": "x"})
                await peer.recv_until("token")
                if rng.random() < 0.5:
                    peer.ws.transport.abort()
                seen["left mid-stream"] += 1
            else:
                seen[(await generate(peer, f"c{i}", 5))["reason"]] += 1


async def load_round(url: str, seen: Counter[str]) -> None:
    async with AsyncExitStack() as stack:
        peers = [(await stack.enter_async_context(raw_peer(url)))[0] for _ in range(CONNECTIONS)]
        generating = [generate(p, "g", 200) for p in peers[:GENERATING]]
        churners = [
            churn(url, random.Random(w), CYCLES // CHURN_WORKERS, seen)
            for w in range(CHURN_WORKERS)
        ]
        results = await asyncio.gather(*generating, *churners)
        assert [r["reason"] for r in results[:GENERATING]] == ["length"] * GENERATING
        for peer in peers[GENERATING:]:  # the idle ones are all still served
            await peer.send({"type": "ping", "t": 1.0})
            assert (await peer.recv())["type"] == "pong"
    await wait_until(lambda: not generation_threads())
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # hand freed heap back: RSS means use
        ctypes.CDLL("libc.so.6").malloc_trim(0)


async def test_200_connections_20_generating_and_1000_churn_cycles_leave_nothing_behind() -> None:
    """Three identical rounds: the first two settle the allocator and fill the resume store to
    its cap; the third must not add to what they left."""
    engine = ScriptedEngine(script)
    process = psutil.Process()
    seen: Counter[str] = Counter()
    rss: list[float] = []
    threads: list[int] = []
    async with running_server(
        engine, max_concurrent=GENERATING + CHURN_WORKERS, max_connections_per_client=1000
    ) as url:
        rss.append(process.memory_info().rss / 2**20)
        for _ in range(3):
            await load_round(url, seen)
            engine.requests.clear()  # the fake engine's own log of requests is not the server's
            threads.append(threading.active_count())
            rss.append(process.memory_info().rss / 2**20)
    assert seen["length"] + seen["left mid-stream"] == 3 * CYCLES
    assert set(seen) <= {"length", "left mid-stream"}
    print(
        f"load: {CONNECTIONS} connections, {GENERATING} generating, {CYCLES} churn cycles a"
        f" round ({seen['left mid-stream']} of {3 * CYCLES} left mid-stream); threads after"
        f" each round {threads}; RSS MiB {' -> '.join(f'{m:.1f}' for m in rss)}"
    )
    assert threads[2] <= threads[1]
    assert rss[3] - rss[2] < 8, f"RSS grew by {rss[3] - rss[2]:.1f} MiB in the third round"

"""bench/door_cpu.py: each door's CPU per response and per token, read from a real uvicorn's
threads (here this process's, where the test serves it)."""

from __future__ import annotations

import asyncio
import os
import time

from bench import door_cpu
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, running_server


def test_a_processs_cpu_is_every_threads_time_on_a_cpu() -> None:
    before = door_cpu.cpu_s(os.getpid())
    started = time.process_time()
    while time.process_time() - started < 0.05:
        pass
    assert door_cpu.cpu_s(os.getpid()) - before >= 0.04


async def test_each_door_gets_its_cpu_per_response_and_per_token() -> None:
    engine = ScriptedEngine(lambda r: Script(["w"] * r.params.max_new_tokens, end_with_eos=False))
    async with running_server(engine) as url, asyncio.timeout(TIMEOUT):
        figures = await door_cpu.measure(os.getpid(), url, rounds=2, short=2, long=6)
    assert set(figures) == {
        "msgpack server",
        "msgpack client",
        "responses server",
        "responses client",
    }
    assert all(set(f) == {"response_ms", "token_ms"} for f in figures.values())
    assert len(engine.requests) == 2 + 2 * 2 * 2  # a warm-up per door; per round, door, length

"""The msgpack WebSocket load helpers (bench/wsload.py) against a real uvicorn over the scripted
engine: a reply cancelled mid-stream, and the session reset after it."""

from __future__ import annotations

import asyncio
import time

from bench import wsload
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, running_server

WORDS = [f" w{i}" for i in range(400)]


def slow_words() -> ScriptedEngine:
    """A word every 10 ms, as many as the prompt asks for (up to 400)."""
    return ScriptedEngine(
        lambda request: Script(
            WORDS[: request.params.max_new_tokens], delay_s=0.01, end_with_eos=False
        )
    )


async def test_a_reply_cancelled_after_its_fourth_token_ends_and_the_session_goes_on() -> None:
    async with running_server(slow_words()) as url, asyncio.timeout(TIMEOUT):
        async with wsload.session(url) as peer:
            sent, done_s = await wsload.cancelled_mid_stream(peer, "c0", "Hi", 400, 4)
            assert sent <= time.perf_counter() and done_s > 0
            await wsload.reset(peer, "r0")
            times = await wsload.stream(peer, "Hello", 3, frame_id="p1")
        waits = await wsload.cancels(url, "Hi", 2)
    assert len(times[0].tokens) == 3
    assert len(waits) == 2 and all(w > 0 for w in waits)

"""``TextTokenizer`` (engine/tokenizing.py): short texts on the loop, long ones in one worker thread
at a time, and a cancelled caller never frees the worker while its thread still runs."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from wschat.server.engine.tokenizing import INLINE_CHARS, TextTokenizer

from tests.fakes.scripted import ScriptedEngine
from tests.support import TIMEOUT

LONG = "x" * (INLINE_CHARS + 1)


class GatedEngine(ScriptedEngine):
    """The scripted engine, whose tokenizing waits for ``gate`` and records where it ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards running and most_at_once
        self.gate = threading.Event()  # set by the test to let tokenizing finish
        self.entered = threading.Semaphore(0)  # released each time a tokenizing starts
        self.ran_on: list[int] = []  # thread idents
        self.running = 0
        self.most_at_once = 0
        super().__init__()  # builds its prompt format, which tokenizes markup: not counted
        self.ran_on.clear()
        self.entered = threading.Semaphore(0)

    def tokenize_text(self, text: str) -> list[int]:
        with self._lock:
            self.ran_on.append(threading.get_ident())
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.entered.release()
        try:
            if len(text) > INLINE_CHARS:
                assert self.gate.wait(TIMEOUT), "the test never opened the gate"
            return super().tokenize_text(text)
        finally:
            with self._lock:
                self.running -= 1

    async def started(self) -> None:
        assert await asyncio.to_thread(self.entered.acquire, True, TIMEOUT)


async def test_a_short_text_is_tokenized_at_once_on_the_loop() -> None:
    engine = GatedEngine()
    assert await TextTokenizer().tokenize(engine.tokenize_text, "hi") == [
        300 + ord("h"),
        300 + ord("i"),
    ]
    assert engine.ran_on == [threading.get_ident()]


async def test_long_texts_are_tokenized_one_at_a_time_off_the_loop() -> None:
    engine = GatedEngine()
    tokenizer = TextTokenizer()
    calls = [asyncio.create_task(tokenizer.tokenize(engine.tokenize_text, LONG)) for _ in range(3)]
    await engine.started()
    assert engine.running == 1 and not engine.entered.acquire(blocking=False)
    engine.gate.set()
    async with asyncio.timeout(TIMEOUT):
        results = await asyncio.gather(*calls)
    assert results == [[300 + ord("x")] * len(LONG)] * 3
    assert engine.most_at_once == 1
    assert threading.get_ident() not in engine.ran_on


async def test_a_cancelled_caller_holds_the_worker_until_its_thread_is_done() -> None:
    engine = GatedEngine()
    tokenizer = TextTokenizer()
    first = asyncio.create_task(tokenizer.tokenize(engine.tokenize_text, LONG))
    await engine.started()
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    second = asyncio.create_task(tokenizer.tokenize(engine.tokenize_text, LONG))
    # the first's thread still runs: the second must not start, however long it waits
    assert not await asyncio.to_thread(engine.entered.acquire, True, 0.2)
    assert engine.running == 1 and len(engine.ran_on) == 1
    engine.gate.set()
    async with asyncio.timeout(TIMEOUT):
        assert len(await second) == len(LONG)
    assert engine.most_at_once == 1

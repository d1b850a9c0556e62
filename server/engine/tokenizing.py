"""``TextTokenizer``: user text to token ids without holding the event loop.

A prompt or system prompt can be 256 KiB that compress to a few hundred bytes on the wire, and
tokenizing that much takes a large fraction of a second. Short texts (most chat turns) are
tokenized at once, where a thread hop would cost more than the work; longer ones go to a worker
thread, one at a time for the whole server, so a flood of them costs one core's worth of
tokenizing at most and never stalls other clients' frames. transformers' fast tokenizers release
the GIL while they encode. ``run`` puts other such work in the same thread: a conversation's
texts tokenized together, an API request's large JSON body parsed.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

# Characters tokenized on the loop: well under a millisecond of work.
INLINE_CHARS = 1024


class TextTokenizer:
    def __init__(self, *, inline_chars: int = INLINE_CHARS) -> None:
        self._inline_chars = inline_chars
        # Held from the moment a long text is handed to a thread until that thread is done
        # (even when its caller was cancelled), so at most one such thread runs at a time.
        self._worker = asyncio.Semaphore(1)

    async def tokenize(self, tokenize: Callable[[str], list[int]], text: str) -> list[int]:
        """``tokenize(text)``: at once for a short text, else in the worker thread."""
        return await self.run(functools.partial(tokenize, text), len(text))

    async def run(self, work: Callable[[], _T], chars: int) -> _T:
        """``work()``, which tokenizes ``chars`` characters in all (several texts at once, say):
        at once when that is short, else in the worker thread."""
        if chars <= self._inline_chars:
            return work()
        await self._worker.acquire()
        try:
            done = asyncio.ensure_future(asyncio.to_thread(work))
        except BaseException:
            self._worker.release()
            raise
        done.add_done_callback(self._thread_done)
        # shield: a cancelled caller must not release the worker while its thread still runs
        return await asyncio.shield(done)

    def _thread_done(self, done: asyncio.Future[_T]) -> None:
        self._worker.release()
        if not done.cancelled():
            done.exception()  # retrieved: a caller that was cancelled no longer awaits it

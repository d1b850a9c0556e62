"""``Gate``: at most ``limit`` of one kind of costly work at once, server-wide; more wait their
turn in arrival order (queued, never refused). The hub keeps one per kind (README "Security and
limits"): image checks, whose decoded bitmaps are the largest memory a request can make the
server hold for a moment, and replays of a reply to resumed connections, each a copy of the
reply held until its peer has taken it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


class Gate:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a gate lets at least one through, not {limit}")
        self.limit = limit
        self._free = asyncio.Semaphore(limit)  # a turn each; FIFO among the waiters
        self.running = 0  # turns held now (/metrics)
        self.waiting = 0  # callers waiting for one (/metrics)
        self.peak = 0  # the most turns held at once so far

    async def thread(self, work: Callable[..., _T], /, *args: object) -> _T:
        """``work(*args)`` in a worker thread, in its turn. The turn ends with the thread, not
        with the caller: a caller cancelled while it runs stops waiting, but the thread cannot
        be stopped, and a turn given up early would let more run than the limit."""
        await self.acquire()
        try:
            running = asyncio.ensure_future(asyncio.to_thread(work, *args))
        except BaseException:
            self.release()
            raise
        running.add_done_callback(self._thread_ended)
        return await asyncio.shield(running)

    def _thread_ended(self, running: asyncio.Future[_T]) -> None:
        self.release()
        if not running.cancelled():
            running.exception()  # retrieved: nobody may be left to await it

    @property
    def free(self) -> bool:
        """A turn is free now: ``acquire`` takes it without waiting (nothing else runs)."""
        return not self._free.locked()

    async def acquire(self) -> None:
        """A turn, once ``limit`` others are not all held; each ``acquire`` one ``release``. A
        caller cancelled while it waits holds none."""
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self.peak = max(self.peak, self.running)

    def release(self) -> None:
        self.running -= 1
        self._free.release()

"""``GraceTimer``: the grace period of a session dropped mid-reply (``--resume-grace-s``): its
timer, and what holds the dropped connection's place until the reply ends or a connection takes
the session back. The core sets and ends it (``SetGrace``, ``EndGrace``); ``Session`` performs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class GraceTimer:
    def __init__(self, over: Callable[[], None]) -> None:
        """``over``: called once the period runs out, unless ``end`` came first."""
        self._over = over
        self._timer: asyncio.TimerHandle | None = None
        # while a reply goes on after a drop: done once it ends or a connection takes the
        # session back (web/admission.py keeps the address's connection place until then)
        self.held: asyncio.Future[None] | None = None

    def start(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._run_out)
        self.held = loop.create_future()

    def _run_out(self) -> None:
        self._timer = None
        self._over()

    def end(self) -> None:
        """The timer stopped, the held place let go. Idempotent."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.held is not None and not self.held.done():
            self.held.set_result(None)

"""``Ticker``: a log line every few seconds while a long step runs, so a slow start (the embedded
model's first-start conversion) never looks hung between its step lines."""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

# Well below the promised 10 s between lines: on a busy machine a tick can come seconds late.
TICK_INTERVAL_S = 6.0


class Ticker:
    """``with Ticker(log, "reading the tokenizer") as ticker:`` logs ``... <step> (N s)`` every
    ``interval_s`` until the block ends; set ``ticker.step`` as the work moves on.

    The ticking thread only logs; it stops, and is joined, when the block ends, however it ends.
    """

    def __init__(self, log: logging.Logger, step: str, interval_s: float = TICK_INTERVAL_S) -> None:
        self.log = log
        self.step = step  # written by the caller's thread, read by the ticker's (one str: atomic)
        self.interval_s = interval_s
        self.started = time.perf_counter()
        self._stop = threading.Event()  # set when the block ends; the ticker thread exits on it
        self.thread = threading.Thread(target=self._tick, name="wschat-ticker", daemon=True)

    def _tick(self) -> None:
        due = self.started + self.interval_s  # on a fixed schedule: a late tick does not drift
        while not self._stop.wait(max(0.0, due - time.perf_counter())):
            now = time.perf_counter()
            self.log.info("  ... %s (%.0f s)", self.step, now - self.started)
            due = max(due + self.interval_s, now + self.interval_s / 2)

    def __enter__(self) -> Ticker:
        self.started = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self.thread.join()

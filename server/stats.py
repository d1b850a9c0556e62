"""``ServerStats``: counters and recent timings fed by generation events, read by ``/v1/stats``
and ``/metrics``."""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

from protocol import Done, FinishReason

from .run import GenerationRun


class ServerStats:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.generations = 0
        self.cancellations = 0
        self.errors: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self._tokens: deque[tuple[float, int]] = deque()  # (time, n) over the last 10 s
        self._ttft: deque[tuple[float, float]] = deque()  # (time, ms) over the last minute
        self.listeners: list[Any] = []

    def on_run_event(self, run: GenerationRun, event: str, value: Any) -> None:
        now = time.monotonic()
        if event == "token":
            self._tokens.append((now, int(value)))
        elif event == "done":
            self._on_done(now, value)
        for listener in self.listeners:
            listener(run, event, value)

    def _on_done(self, now: float, done: Done) -> None:
        self.generations += 1
        self.prompt_tokens += done.usage.prompt_tokens
        self.cached_tokens += done.usage.cached_tokens
        self.generation_tokens += done.usage.completion_tokens
        if done.reason is FinishReason.CANCELLED:
            self.cancellations += 1
        if done.timing.ttft_ms is not None:
            self._ttft.append((now, done.timing.ttft_ms))

    def count_error(self, code: str) -> None:
        self.errors[code] += 1

    def tokens_per_s(self, window: float = 10.0) -> float:
        now = time.monotonic()
        while self._tokens and self._tokens[0][0] < now - window:
            self._tokens.popleft()
        span = min(window, max(now - self.started, 1e-9))
        return sum(n for _, n in self._tokens) / span

    def ttft_percentiles(self, window: float = 60.0) -> tuple[float | None, float | None]:
        now = time.monotonic()
        while self._ttft and self._ttft[0][0] < now - window:
            self._ttft.popleft()
        values = sorted(ms for _, ms in self._ttft)
        if not values:
            return None, None
        return _percentile(values, 0.5), _percentile(values, 0.95)

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]

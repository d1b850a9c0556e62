"""``ServerStats``: counters and recent timings fed by generation events, read by ``/v1/stats``
and ``/metrics``.

Recent windows are pruned as they grow, not only when read, so memory stays bounded however
long nobody looks: tokens sit in 100 ms buckets (at most ~100 over 10 s) and TTFT samples are
capped in number as well as in age.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable

from wschat.protocol import Done, ErrorCode, FinishReason

from .events import RunDone, RunEvent, RunListener, TokensSent

TOKENS_WINDOW_S = 10.0
TTFT_WINDOW_S = 60.0
_BUCKET_S = 0.1
_MAX_TTFT_SAMPLES = 10_000
# The APIs a generation is asked for by (the ``api`` label of ``wschat_generations_total``)
WEBSOCKET = "websocket"
OPENAI_API = "openai"
RESPONSES_API = "responses"  # over HTTP
RESPONSES_SOCKET = "responses_websocket"  # the Responses API's WebSocket mode
APIS = (WEBSOCKET, OPENAI_API, RESPONSES_API, RESPONSES_SOCKET)


class ServerStats:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.generations = 0
        self.cancellations = 0
        self.errors: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.rewinds = 0  # rewind frames answered ``rewound``
        self.regenerates = 0  # regenerate frames accepted (queued)
        # generations ended, by the API that asked: one of APIS
        self.generations_by_api: Counter[str] = Counter()
        self._tokens: deque[list[int]] = deque()  # [bucket number, tokens in it], oldest first
        self._ttft: deque[tuple[float, float]] = deque(maxlen=_MAX_TTFT_SAMPLES)  # (time, ms)
        self.listeners: list[RunListener] = []

    def on_run_event(self, event: RunEvent, api: str = WEBSOCKET) -> None:
        now = self._clock()
        if isinstance(event, TokensSent):
            self._add_tokens(now, event.count)
        elif isinstance(event, RunDone):
            self._on_done(now, event.done)
            self.generations_by_api[api] += 1
        for listener in self.listeners:
            listener(event)

    def _add_tokens(self, now: float, n: int) -> None:
        bucket = int(now / _BUCKET_S)
        if self._tokens and self._tokens[-1][0] == bucket:
            self._tokens[-1][1] += n
        else:
            self._tokens.append([bucket, n])
        self._prune_tokens(now, TOKENS_WINDOW_S)

    def _on_done(self, now: float, done: Done) -> None:
        self.generations += 1
        self.prompt_tokens += done.usage.prompt_tokens
        self.cached_tokens += done.usage.cached_tokens
        self.generation_tokens += done.usage.completion_tokens
        if done.reason is FinishReason.CANCELLED:
            self.cancellations += 1
        if done.timing.ttft_ms is not None:
            self._ttft.append((now, done.timing.ttft_ms))
            self._prune_ttft(now, TTFT_WINDOW_S)

    def count_error(self, code: ErrorCode) -> None:
        self.errors[code.value] += 1

    def count_rewind(self, regenerate: bool = False) -> None:
        """A rewind the session answered, or a regenerate it accepted."""
        if regenerate:
            self.regenerates += 1
        else:
            self.rewinds += 1

    def tokens_per_s(self, window: float = TOKENS_WINDOW_S) -> float:
        now = self._clock()
        self._prune_tokens(now, TOKENS_WINDOW_S)
        oldest = int((now - window) / _BUCKET_S)
        span = min(window, max(now - self.started, 1e-9))
        return sum(n for bucket, n in self._tokens if bucket >= oldest) / span

    def ttft_percentiles(self, window: float = TTFT_WINDOW_S) -> tuple[float | None, float | None]:
        now = self._clock()
        self._prune_ttft(now, TTFT_WINDOW_S)
        values = sorted(ms for at, ms in self._ttft if at >= now - window)
        if not values:
            return None, None
        return _percentile(values, 0.5), _percentile(values, 0.95)

    @property
    def uptime_s(self) -> float:
        return self._clock() - self.started

    @property
    def buffered_samples(self) -> int:
        """Entries held in the recent windows (what the pruning keeps bounded)."""
        return len(self._tokens) + len(self._ttft)

    def _prune_tokens(self, now: float, window: float) -> None:
        oldest = int((now - window) / _BUCKET_S)
        while self._tokens and self._tokens[0][0] < oldest:
            self._tokens.popleft()

    def _prune_ttft(self, now: float, window: float) -> None:
        while self._ttft and self._ttft[0][0] < now - window:
            self._ttft.popleft()


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]

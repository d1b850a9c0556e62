"""``ServerStats``: recent windows on a controlled clock, bounded however long nobody reads."""

from __future__ import annotations

from typing import cast

import pytest
from wschat.protocol import Done, ErrorCode, FinishReason, Timing, Usage
from wschat.server.sessions.events import RunDone, RunEvent, TokensSent
from wschat.server.sessions.generation import GenerationRun
from wschat.server.sessions.stats import ServerStats

RUN = cast(GenerationRun, object())  # ServerStats only hands the run on to its listeners


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def done(reason: FinishReason = FinishReason.STOP, ttft_ms: float | None = 50.0) -> Done:
    return Done("g", reason, "text", Usage(10, 4, 3), Timing(1.0, ttft_ms, 20.0, 200.0))


def test_token_window_stays_bounded_when_nobody_reads_it() -> None:
    clock = Clock()
    stats = ServerStats(clock)
    for _ in range(20_000):  # an hour and a half of tokens every quarter second
        clock.now += 0.25
        stats.on_run_event(TokensSent(RUN, 1))
    assert stats.buffered_samples <= 101
    assert stats.tokens_per_s() == pytest.approx(4.0, rel=0.03)  # 100 ms buckets at the edge


def test_tokens_per_s_counts_only_the_last_ten_seconds() -> None:
    clock = Clock()
    stats = ServerStats(clock)
    clock.now += 30
    stats.on_run_event(TokensSent(RUN, 500))  # 20 s before the read: outside the window
    clock.now += 15
    stats.on_run_event(TokensSent(RUN, 30))
    clock.now += 5
    stats.on_run_event(TokensSent(RUN, 20))
    assert stats.tokens_per_s() == 5.0


def test_tokens_per_s_divides_by_the_uptime_while_it_is_under_the_window() -> None:
    clock = Clock()
    stats = ServerStats(clock)
    clock.now += 2
    stats.on_run_event(TokensSent(RUN, 8))
    assert stats.tokens_per_s() == 4.0


def test_ttft_percentiles_cover_the_last_minute_and_skip_replies_without_tokens() -> None:
    clock = Clock()
    stats = ServerStats(clock)
    stats.on_run_event(RunDone(RUN, done(ttft_ms=9000.0)))
    clock.now += 61
    assert stats.ttft_percentiles() == (None, None)
    for ms in range(1, 101):
        stats.on_run_event(RunDone(RUN, done(ttft_ms=float(ms))))
    stats.on_run_event(RunDone(RUN, done(FinishReason.CANCELLED, ttft_ms=None)))
    assert stats.ttft_percentiles() == (51.0, 95.0)
    assert stats.buffered_samples == 100


def test_done_adds_usage_cancellations_and_reaches_listeners() -> None:
    stats = ServerStats(Clock())
    seen: list[RunEvent] = []
    stats.listeners.append(seen.append)
    stats.on_run_event(RunDone(RUN, done()))
    stats.on_run_event(RunDone(RUN, done(FinishReason.CANCELLED)))
    stats.count_error(ErrorCode.BUSY)
    stats.count_error(ErrorCode.BUSY)
    assert (stats.generations, stats.cancellations) == (2, 1)
    assert (stats.prompt_tokens, stats.cached_tokens, stats.generation_tokens) == (20, 6, 8)
    assert stats.errors == {"busy": 2}
    assert [(type(e), e.done.reason) for e in seen if isinstance(e, RunDone)] == [
        (RunDone, FinishReason.STOP),
        (RunDone, FinishReason.CANCELLED),
    ]
    assert len(seen) == 2


def test_rewinds_and_regenerates_are_counted_apart() -> None:
    stats = ServerStats(Clock())
    stats.count_rewind(False)
    stats.count_rewind(True)
    stats.count_rewind(False)
    assert (stats.rewinds, stats.regenerates) == (2, 1)

"""Figures from token timestamps: TTFT, inter-token gaps, rates, percentiles."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class StreamTimes:
    """One stream: when its request was sent and when each of its tokens arrived."""

    sent: float
    tokens: list[float]

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:], strict=False)]

    @property
    def rate(self) -> float:
        """Tokens per second after the first (the decode rate a reader sees)."""
        span = self.tokens[-1] - self.tokens[0] if self.tokens else 0.0
        if len(self.tokens) < 2 or span <= 0:  # none, or all in one (merged) frame
            return 0.0
        return (len(self.tokens) - 1) / span


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass(frozen=True, slots=True)
class Concurrent:
    """What N streams started together achieved."""

    streams: int
    tokens: int
    aggregate: float  # tokens/s over the wall time from the first send to the last token
    ttft_median: float
    ttft_p95: float
    itl_p95: float

    @classmethod
    def of(cls, streams: Sequence[StreamTimes]) -> Concurrent:
        start = min(s.sent for s in streams)
        end = max(s.tokens[-1] for s in streams if s.tokens)
        tokens = sum(len(s.tokens) for s in streams)
        ttfts = [s.ttft for s in streams if s.tokens]
        gaps = [g for s in streams for g in s.gaps]
        return cls(
            len(streams),
            tokens,
            tokens / (end - start),
            median(ttfts),
            percentile(ttfts, 95),
            percentile(gaps, 95),
        )


def figures_over_rounds(rounds: list[list[StreamTimes]]) -> dict[str, Any]:
    """Rounds of one concurrency: each figure is the median over rounds of that round's figure,
    so one round disturbed by another user of the machine does not decide it."""
    per_round = [Concurrent.of(r) for r in rounds]
    rates = [median([s.rate for s in r]) for r in rounds]
    return {
        "streams": per_round[0].streams,
        "tokens": per_round[0].tokens,
        "aggregate_tps": median([c.aggregate for c in per_round]),
        "stream_tps": median(rates),
        "ttft_median_s": median([c.ttft_median for c in per_round]),
        "ttft_p95_s": median([c.ttft_p95 for c in per_round]),
        "itl_median_s": median([median([g for s in r for g in s.gaps]) for r in rounds]),
        "itl_p95_s": median([c.itl_p95 for c in per_round]),
        "rounds": len(rounds),
        "aggregate_tps_rounds": [c.aggregate for c in per_round],
        "ttft_p95_rounds": [c.ttft_p95 for c in per_round],
        "stream_tps_rounds": rates,
    }

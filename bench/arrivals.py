"""Staggered arrivals: sessions that join one by one while the others decode.

The first session's prompt reaches an idle server; every ``every_steps`` decode steps (of the
static batch at the full width, measured in the same round) another session sends its prompt,
until ``sessions`` decode together. Each joiner's TTFT (from its send to its first token) is set
against the in-process ceiling's TTFT for the same prompt alone (``generate`` of that one
prompt, measured in the same round): what a user who joins a busy server waits, against what
the model needs for that prompt. A joiner cannot start before the forward pass in flight ends,
so the target allows one decode step of the full batch on top (issue 15: a prompt that arrives
while others decode gets its prefill into the next forward passes).

Each round measures the ceiling (single prompts and the full static batch) and then the
server, back to back; each figure is the median over rounds of that round's figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import wsload
from .figures import Target, at_most
from .render import figure
from .stats import StreamTimes, median, percentile
from .workload import Workload, story

log = logging.getLogger("bench.arrivals")

TARGET = 1.2  # joiners' TTFT p95 <= 1.2 x (the prompt alone + one step of the full batch)


@dataclass(frozen=True, slots=True)
class ArrivalsWork:
    sessions: int = 8
    tokens: int = 64  # each session's reply: the first still decodes when the last joins
    every_steps: int = 4  # a new session every this many decode steps of the full batch
    rounds: int = 3

    @classmethod
    def of(cls, work: Workload) -> ArrivalsWork:
        return cls(max(work.concurrency), work.tokens, rounds=work.arrival_rounds)

    def texts(self) -> list[str]:
        return [story(i) for i in range(self.sessions)]


class Ceiling(Protocol):
    """What ``run`` needs of the in-process ceiling (``bench.inprocess.InProcess``)."""

    def static(self, texts: list[str], tokens: int) -> list[StreamTimes]: ...


def run(work: ArrivalsWork, url: str, ceiling: Ceiling) -> dict[str, Any]:
    rounds = []
    texts = work.texts()
    for r in range(work.rounds):
        alone = [ceiling.static([text], 1)[0].ttft for text in texts]
        batch = ceiling.static(texts, 8)
        step = median([g for s in batch for g in s.gaps])
        interval = work.every_steps * step
        log.info("round %d: a session every %.0f ms", r + 1, interval * 1000)
        streams = asyncio.run(staggered(url, texts, work.tokens, interval))
        rounds.append(
            {"interval_s": interval, "step_s": step, "alone_s": alone,
             "ttft_s": [s.ttft for s in streams]}
        )  # fmt: skip
    return {"workload": dataclasses.asdict(work), "rounds": rounds, **figures(rounds)}


async def staggered(
    url: str, texts: Sequence[str], tokens: int, interval_s: float
) -> list[StreamTimes]:
    """One session per text, all connected first; the i-th sends its prompt ``i * interval_s``
    after the first."""
    async with contextlib.AsyncExitStack() as stack:
        peers = [await stack.enter_async_context(wsload.session(url)) for _ in texts]
        start = time.perf_counter()

        async def join(i: int, peer: wsload.Peer) -> StreamTimes:
            await asyncio.sleep(max(0.0, start + i * interval_s - time.perf_counter()))
            times, _ = await wsload.stream(peer, texts[i], tokens, frame_id=f"a{i}")
            return times

        return list(await asyncio.gather(*(join(i, p) for i, p in enumerate(peers))))


def figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The joiners (every session but the first, which finds the server idle) by round: their
    TTFT median and p95, the same prompts alone in process, and the bound of the target (the
    prompts alone, median, plus one step of the full batch); each the median over rounds."""
    per_round = []
    for r in rounds:
        joiners, alone = r["ttft_s"][1:], r["alone_s"][1:]
        bound = median(alone) + r["step_s"]
        p95 = percentile(joiners, 95)
        per_round.append(
            {"ttft_median_s": median(joiners), "ttft_p95_s": p95,
             "alone_median_s": median(alone), "step_s": r["step_s"], "bound_s": bound,
             "p95_x_alone": p95 / median(alone), "p95_x_bound": p95 / bound}
        )  # fmt: skip
    return {key: statistics.median(f[key] for f in per_round) for key in per_round[0]}


def targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target.judged(
            f"staggered joiners' TTFT p95 <= {TARGET} x (alone + one step)",
            value=result["ttft_p95_s"],
            against=result["bound_s"],
            ratio=result["p95_x_bound"],
            limit=at_most(TARGET),
            unit="ms",
        )
    ]


def lines(result: dict[str, Any]) -> list[str]:
    """The cadence, the joiners' TTFT and the same prompts alone (in the main run's text)."""
    work = result["workload"]
    return [
        f"staggered arrivals: {work['sessions']} sessions, one more every "
        f"{work['every_steps']} decode steps of the static batch "
        f"({figure(result['step_s'], 'ms')} each), {work['tokens']} tokens each, median of "
        f"{work['rounds']} rounds:",
        f"joiners' TTFT median {figure(result['ttft_median_s'], 'ms')}, p95 "
        f"{figure(result['ttft_p95_s'], 'ms')}; the same prompts alone in process "
        f"{figure(result['alone_median_s'], 'ms')} (p95 {figure(result['p95_x_alone'], 'x')} of "
        "it)",
    ]

"""The mid-reply resume scenario (``--only resume``): a reply's connection dropped mid-stream and
resumed at once (PROTOCOL.md section 10), ``drops`` times, on wschat with the embedded model.

Each drop is a fresh session given the same greedy prompt; after ``after`` token frames the client
closes its TCP connection without a close frame (the transport aborted, as a lost network does)
and at once opens the session again with ``?session=&resume=&last=``. Measured: the resume
latency, from the drop to the first ``token`` frame on the new connection (reconnect, handshake,
the claim, ``ready``, the replay), its median and p95; checked: for every drop, the text before
the drop followed by the text after equals the uninterrupted greedy reply to the same prompt (read
first, on a session of its own), with the token indices rising, none repeated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs
from .figures import Section, Target
from .render import figure
from .stats import median, percentile
from .workload import story
from .wsload import Peer, session

log = logging.getLogger("bench.resume")

PROMPT = story(0)


@dataclass(frozen=True, slots=True)
class ResumeWork:
    drops: int = 20
    tokens: int = 128  # the reply's length: still running when the drop comes
    after: int = 4  # token frames received before the drop

    @classmethod
    def quick(cls) -> ResumeWork:
        return cls(drops=3, tokens=48)


@dataclass(frozen=True, slots=True)
class Drop:
    """One drop and its resume: the token frames before and after, and the latency (s)."""

    before: list[dict[str, Any]]
    after: list[dict[str, Any]]
    latency: float
    reply: str | None  # ``ready.resumed.reply`` of the resumed connection


def run(work: ResumeWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    with procs.wschat(engine, logs, sessions=64, name="wschat-resume") as server:
        reference, drops = asyncio.run(_measure(server.ws_url, work))
    return {"workload": dataclasses.asdict(work), "engine": engine, **summary(reference, drops)}


async def _measure(url: str, work: ResumeWork) -> tuple[str, list[Drop]]:
    async with session(url) as peer:
        await _prompt(peer, work.tokens)
        reference = (await _until(peer, "done"))[-1]["text"]
    drops = []
    for i in range(work.drops):
        drops.append(await _drop_and_resume(url, work))
        log.info("drop %d: resumed in %.1f ms", i + 1, drops[-1].latency * 1000)
    return reference, drops


async def _drop_and_resume(url: str, work: ResumeWork) -> Drop:
    async with session(url) as peer:
        await _prompt(peer, work.tokens)
        before = [f for f in await _until(peer, "token", work.after) if f["type"] == "token"]
        dropped_at = time.perf_counter()
        peer.ws.transport.abort()
    ready = peer.ready
    query = f"session={ready['session']}&resume={ready['resume']}&last={before[-1]['index']}"
    async with session(f"{url}?{query}") as peer:
        frames = await _until(peer, "token")
        latency = time.perf_counter() - dropped_at
        if frames[-1]["type"] != "done":
            frames += await _until(peer, "done")
    after = [f for f in frames if f["type"] in ("token", "done")]
    return Drop(before, after, latency, (peer.ready.get("resumed") or {}).get("reply"))


async def _prompt(peer: Peer, tokens: int) -> None:
    params = {"max_new_tokens": tokens, "temperature": 0}
    await peer.send({"type": "prompt", "id": "p", "text": PROMPT, "params": params})


async def _until(peer: Peer, kind: str, count: int = 1) -> list[dict[str, Any]]:
    """Frames until ``count`` of type ``kind`` came, or ``done``."""
    frames: list[dict[str, Any]] = []
    while sum(f["type"] == kind for f in frames) < count:
        frames.append(await peer.recv())
        if frames[-1]["type"] == "done":
            break
    return frames


# -- what the drops add up to (no I/O: tests/bench/test_resume.py) -------------------------------


def whole(reference: str, drop: Drop) -> bool:
    """The text before the drop and after it is the uninterrupted reply, none of it twice, and
    the resumed stream ends with a ``done`` whose text is that reply."""
    tokens = [*drop.before, *(f for f in drop.after if f["type"] == "token")]
    indices = [f["index"] for f in tokens]
    done = drop.after[-1] if drop.after and drop.after[-1]["type"] == "done" else None
    rising = all(a < b for a, b in itertools.pairwise(indices))
    text = "".join(f["text"] for f in tokens)
    return rising and text == reference and done is not None and done["text"] == reference


def summary(reference: str, drops: Sequence[Drop]) -> dict[str, Any]:
    latencies = [d.latency for d in drops]
    broken = [i for i, d in enumerate(drops) if not whole(reference, d)]
    return {
        "drops": len(drops),
        "latency_s": latencies,
        "latency_median_s": median(latencies),
        "latency_p95_s": percentile(latencies, 95),
        "whole": len(drops) - len(broken),
        "broken": broken,  # the drops whose text was not the uninterrupted reply
        "resumed_reply": sum(d.reply is not None for d in drops),
        "reference_chars": len(reference),
    }


def targets(result: dict[str, Any]) -> list[Target]:
    """Issue 14: every drop resumes with the whole reply, nothing lost or repeated."""
    whole, drops = result["whole"], result["drops"]
    return [
        Target(
            target="resume: every dropped reply resumed whole, none repeated",
            value=whole,
            against=drops,
            unit="",
            ratio=None,
            ratio_unit="",
            limit=drops,
            op="==",
            met=whole == drops,
        )
    ]


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    return Section(
        [
            f"mid-reply resume: wschat --engine {result['engine']} on the embedded model; "
            f"{result['drops']} drops, each after {work['after']} token frames of a "
            f"{work['tokens']}-token greedy reply, resumed at once",
            f"resume latency (drop to first token frame on the new connection): median "
            f"{figure(result['latency_median_s'], 'ms')}, p95 "
            f"{figure(result['latency_p95_s'], 'ms')}",
            f"whole replies (before + after == uninterrupted, indices rising): "
            f"{result['whole']} of {result['drops']}",
        ],
        targets(result),
    )

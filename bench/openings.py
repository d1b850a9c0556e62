"""``python -m bench --only openings``: what sharing the conversations' opening buys a first
prompt, on wschat with the embedded model over real servers and WebSockets.

Two servers run side by side, the same but for ``--shared-openings`` (the default, 4, against 0),
each with the default prompt format (``--prompt-format auto``: the embedded base model's
``transcript``, whose instruction line and examples open every conversation) and no system
prompt. Each round measures both, in alternating order: 8 first prompts sent at once on fresh
sessions, then 1 alone, each timed from its prompt to its first token, greedy and short. A
warm-up prompt on each server first: the pool's opening is kept by the first conversation that
prefills it, as any server's would be after its first session.

Checked: ``start.cached_tokens`` of every first prompt, the opening's length with the pool and 0
without it. The figure: the median TTFT with the pool over the median without, per concurrency,
in the same run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs, wsload
from .figures import Section, Target, at_most
from .render import figure
from .stats import median

log = logging.getLogger("bench.openings")

# A first prompt's TTFT with the pool over without it, at most, by prompts at once: 8 at once
# prefill ~92 % less (the opening's share of a short first prompt); 1 alone never slower.
TARGETS = {"8": 0.5, "1": 1.0}
MODES = {"shared": (), "unshared": ("--shared-openings", "0")}
QUESTIONS = (
    "What is the tallest mountain in Africa?",
    "Who wrote Pride and Prejudice?",
    "How many moons does Mars have?",
    "What is the boiling point of water in Fahrenheit?",
    "Which planet is closest to the Sun?",
    "Who painted The Starry Night?",
    "What is the largest ocean on Earth?",
    "How many strings does a violin have?",
)


@dataclass(frozen=True, slots=True)
class OpeningsWork:
    concurrency: tuple[int, ...] = (8, 1)
    rounds: int = 6
    tokens: int = 8  # new tokens per stream: only the first is timed

    @classmethod
    def quick(cls) -> OpeningsWork:
        return cls(rounds=2)


def run(work: OpeningsWork, logs: Path, engine: str = "batched") -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    extra = ("--prompt-format", "auto")
    with (
        procs.wschat(engine, logs, 64, (*extra, *MODES["shared"]), "wschat-openings-on") as on,
        procs.wschat(engine, logs, 64, (*extra, *MODES["unshared"]), "wschat-openings-off") as off,
    ):
        urls = {"shared": on.ws_url, "unshared": off.ws_url}
        samples = asyncio.run(_rounds(work, urls))
    return {"workload": dataclasses.asdict(work), "engine": engine, **summary(samples)}


async def _rounds(work: OpeningsWork, urls: dict[str, str]) -> dict[str, dict[int, list[Any]]]:
    """Per mode and concurrency, every first prompt's (TTFT, prompt tokens, cached tokens)."""
    for url in urls.values():
        await wsload.served(url, [QUESTIONS[0]], work.tokens)  # the warm-up
    samples: dict[str, dict[int, list[Any]]] = {m: {n: [] for n in work.concurrency} for m in urls}
    for i in range(work.rounds):
        order = list(urls) if i % 2 == 0 else list(reversed(urls))
        for mode in order:
            for n in work.concurrency:
                texts = [QUESTIONS[(i + k) % len(QUESTIONS)] for k in range(n)]
                for times, frames in await wsload.served(urls[mode], texts, work.tokens):
                    sample = (times.ttft, frames["prompt_tokens"], frames["cached_tokens"])
                    samples[mode][n].append(sample)
        log.info("round %d of %d done", i + 1, work.rounds)
    return samples


# -- what the rounds add up to (no I/O: tests/bench/test_openings.py) --------------------------


def summary(samples: dict[str, dict[int, list[Any]]]) -> dict[str, Any]:
    """Medians per mode and concurrency, the pool's ratio, and the cached tokens seen."""
    out: dict[str, Any] = {"modes": {}}
    for mode, by_n in samples.items():
        out["modes"][mode] = {
            str(n): {
                "ttft_median_s": median([s[0] for s in rows]),
                "prompt_tokens": sorted({s[1] for s in rows}),
                "cached_tokens": sorted({s[2] for s in rows}),
                "streams": len(rows),
            }
            for n, rows in by_n.items()
        }
    shared, unshared = out["modes"]["shared"], out["modes"]["unshared"]
    out["shared_over_unshared"] = {
        n: shared[n]["ttft_median_s"] / unshared[n]["ttft_median_s"] for n in shared
    }
    return out


def targets(result: dict[str, Any]) -> list[Target]:
    rows = []
    for n, ratio in result["shared_over_unshared"].items():
        limit = TARGETS.get(n, 1.0)
        rows.append(
            Target.judged(
                f"{n} first prompts at once, TTFT: shared opening / none <= {limit}",
                value=result["modes"]["shared"][n]["ttft_median_s"],
                against=result["modes"]["unshared"][n]["ttft_median_s"],
                ratio=ratio,
                limit=at_most(limit),
                unit="ms",
            )
        )
    return rows


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    out = Section(
        [
            f"first prompts on fresh sessions: wschat --engine {result['engine']}, embedded "
            f"model, default prompt format, {work['rounds']} rounds (order alternating), medians"
        ],
        targets(result),
    )
    for n, ratio in result["shared_over_unshared"].items():
        cells = []
        for mode in ("shared", "unshared"):
            row = result["modes"][mode][n]
            cells.append(
                f"{mode} TTFT {figure(row['ttft_median_s'], 'ms')} (cached_tokens "
                f"{row['cached_tokens']} of {row['prompt_tokens']})"
            )
        out.parts.append(f"  {n} at once: {'; '.join(cells)}; shared / unshared {ratio:.2f}")
    return out

"""``python -m bench --only choices`` (and the full run): ``n`` choices on the HTTP API against as
many separate requests, on wschat with the embedded model over a real server.

Each round, in alternating order: one chat completion with ``n`` 4 (sampled, its seed), and four
chat completions of the same prompt at once (seeds 1 to 4), each reply 48 tokens at most. The
figure: tokens generated over the wall time of each, the request with ``n`` over the four
(median of the rounds). With it, what the server's counters say the ``n`` request prefilled:
``wschat_prompt_tokens`` less ``wschat_cached_prompt_tokens`` (/metrics) across it, against its
``usage.prompt_tokens``: the prompt prefilled once. Four requests of one prompt from one owner
are siblings too (engine/local/siblings.py), so the four share a prefill as well.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import procs
from .figures import Section, Target, at_least
from .render import figure
from .stats import median

TARGET = 0.9  # n choices' tokens/s at least this times as many separate requests'
PROMPT = "Write a short poem about the sea."
COUNTERS = re.compile(r"^(wschat_prompt_tokens|wschat_cached_prompt_tokens)_total (\S+)$", re.M)


@dataclass(frozen=True, slots=True)
class ChoicesWork:
    rounds: int = 4
    n: int = 4
    tokens: int = 48

    @classmethod
    def quick(cls) -> ChoicesWork:
        return cls(rounds=2)


def run(work: ChoicesWork, logs: Path, engine: str) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    with procs.wschat(engine, logs, 64, (), "wschat-choices") as server:
        result = asyncio.run(_measure(work, server.base))
    return {"workload": dataclasses.asdict(work), "engine": engine, **result}


async def _measure(work: ChoicesWork, base: str) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"choices": [], "requests": []}
    prefilled: list[int] = []
    prompts: list[int] = []
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await _ask(client, work, 1, 0)  # warm-up
        for i in range(work.rounds):
            for mode in ("choices", "requests") if i % 2 == 0 else ("requests", "choices"):
                if mode == "choices":
                    before = await _counters(client)
                    started = time.perf_counter()
                    body = await _ask(client, work, work.n, 1)
                    wall = time.perf_counter() - started
                    after = await _counters(client)
                    prefilled.append(round(after[0] - after[1] - before[0] + before[1]))
                    prompts.append(body["usage"]["prompt_tokens"])
                    tokens = body["usage"]["completion_tokens"]
                else:
                    started = time.perf_counter()
                    bodies = await asyncio.gather(
                        *(_ask(client, work, 1, seed) for seed in range(1, work.n + 1))
                    )
                    wall = time.perf_counter() - started
                    tokens = sum(b["usage"]["completion_tokens"] for b in bodies)
                rates[mode].append(tokens / wall)
    choices, requests = median(rates["choices"]), median(rates["requests"])
    return {
        "choices_tokens_per_s": choices,
        "requests_tokens_per_s": requests,
        "ratio": choices / requests,
        "prefilled_tokens": prefilled,
        "prompt_tokens": prompts,
    }


async def _ask(client: httpx.AsyncClient, work: ChoicesWork, n: int, seed: int) -> Any:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "n": n,
        "max_tokens": work.tokens,
        "temperature": 1.0,
        "seed": seed,
    }
    answer = await client.post("/v1/chat/completions", json=body)
    answer.raise_for_status()
    return answer.json()


async def _counters(client: httpx.AsyncClient) -> tuple[float, float]:
    """The server's prompt tokens and cached prompt tokens so far (/metrics)."""
    text = (await client.get("/metrics")).text
    found = dict(COUNTERS.findall(text))
    return float(found["wschat_prompt_tokens"]), float(found["wschat_cached_prompt_tokens"])


def targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target.judged(
            f"n = 4: tokens/s of one request with n / four requests >= {TARGET}",
            value=result["choices_tokens_per_s"],
            against=result["requests_tokens_per_s"],
            ratio=result["ratio"],
            limit=at_least(TARGET),
        )
    ]


def report(result: dict[str, Any]) -> Section:
    work = result["workload"]
    return Section(
        [
            f"n choices: wschat --engine {result['engine']}, embedded model, {work['rounds']} "
            f"rounds (order alternating), {work['tokens']} tokens a reply",
            f"  n = {work['n']}: {figure(result['choices_tokens_per_s'])} tokens/s against "
            f"{figure(result['requests_tokens_per_s'])} for {work['n']} requests "
            f"({result['ratio']:.2f}x); prompt tokens prefilled per request with n "
            f"{result['prefilled_tokens']} of usage.prompt_tokens {result['prompt_tokens']}",
        ],
        targets(result),
    )

"""The same streams against ``transformers serve`` (OpenAI-style ``/v1/completions`` with SSE).

The embedded model's folder has no chat template, so the peer gets the prompt already in
Gemma 3's turn format, the text wschat's conversation renders (it adds ``<bos>`` itself).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from .stats import StreamTimes

TIMEOUT = 600.0


def gemma_turn(text: str) -> str:
    return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


async def stream(
    client: httpx.AsyncClient, base: str, model: str, text: str, max_new_tokens: int
) -> StreamTimes:
    body = {
        "model": model,
        "prompt": gemma_turn(text),
        "max_tokens": max_new_tokens,
        "temperature": 0,
        "stream": True,
    }
    times = StreamTimes(time.perf_counter(), [])
    completion = 0
    async with client.stream("POST", base + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if any(choice.get("text") for choice in chunk.get("choices", ())):
                times.tokens.append(time.perf_counter())
            usage = chunk.get("usage")
            if usage:
                completion = int(usage["completion_tokens"])
    if times.tokens and completion > len(times.tokens):  # text held back, then sent at once
        times.tokens += [times.tokens[-1]] * (completion - len(times.tokens))
    return times


async def concurrent(
    base: str, model: str, texts: list[str], max_new_tokens: int
) -> list[StreamTimes]:
    limits = httpx.Limits(max_connections=len(texts) + 1)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        return list(
            await asyncio.gather(*(stream(client, base, model, t, max_new_tokens) for t in texts))
        )

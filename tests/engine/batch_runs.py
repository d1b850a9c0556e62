"""Replies of the batched engine set against replies run alone, for the engine tests: the batch
width they use, prompts shorter and longer than the window and the prefill chunk, greedy
parameters, a reply run alone."""

from __future__ import annotations

from typing import Any

from wschat.server.engine.base import (
    GenerationRequest,
    SamplingParams,
)
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine

from tests.support import collect

WIDTH = 8


def prompts(engine: HFEngine | BatchedEngine, count: int) -> list[list[int]]:
    """Prompts of 3 to 60 tokens: shorter and longer than the window and the prefill chunk."""
    return [[2, *engine.tokenize_text("hello world " * (1 + 4 * i))] for i in range(count)]


def greedy(tokens: int, **extra: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, **extra)


async def alone(engine: HFEngine | BatchedEngine, ids: list[int], params: SamplingParams) -> str:
    text, finished = await collect(engine.generate(GenerationRequest(ids, params)))
    assert finished.error is None
    return text

"""Replies to one prompt in the batched engine (``local/siblings.py``), on the tiny random Gemma 3:
the prompt is prefilled once for all of them, each reply is the one it gets alone with its own
seed, and a sibling whose leader ends before its prompt is fed prefills on its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from wschat.server.engine.base import GenerationRequest, SamplingParams
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.support import collect

SEEDS = (11, 12, 13, 14)


@pytest.fixture
async def batched(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=4, prefill_tokens=32))
    yield engine
    await engine.aclose()


def prompt(engine: BatchedEngine) -> list[int]:
    return [2, *engine.tokenize_text("four replies to one question " * 5)]


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed)


async def test_four_replies_to_one_prompt_prefill_it_once_and_each_is_its_own(
    batched: BatchedEngine,
) -> None:
    ids = prompt(batched)
    alone = [
        (await collect(batched.generate(GenerationRequest(ids, sampled(seed)))))[0]
        for seed in SEEDS
    ]
    before = batched.prefilled_tokens
    generations = [batched.generate(GenerationRequest(ids, sampled(seed))) for seed in SEEDS]
    results = await asyncio.gather(*(collect(g) for g in generations))
    assert batched.prefilled_tokens - before == len(ids)  # once, for all four
    assert [text for text, _ in results] == alone
    cached = [finished.usage.cached_tokens for _, finished in results if finished.usage]
    assert cached == [0, len(ids), len(ids), len(ids)]
    assert len(set(alone)) > 1  # the seeds made them differ


async def test_a_sibling_whose_leader_is_cancelled_while_waiting_prefills_alone(
    batched: BatchedEngine,
) -> None:
    ids = prompt(batched)
    leader = batched.generate(GenerationRequest(ids, sampled(SEEDS[0])))
    leader.cancel()  # before the worker takes it in
    follower = batched.generate(GenerationRequest(ids, sampled(SEEDS[1])))
    (_, ended), (text, finished) = await asyncio.gather(collect(leader), collect(follower))
    assert ended.reason.value == "cancelled"
    assert finished.reason.value == "length" and text
    assert finished.usage is not None and finished.usage.cached_tokens == 0

"""Structured output and logprobs in both local engines, on the tiny random Gemma 3 (float32):
a constrained reply is JSON that matches its schema whatever the weights say, a constrained
row leaves its unconstrained batch mates' replies as they are alone, and each token's logprobs
are the model's own distribution (a greedy pick is the most probable), the same on both paths.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator

import jsonschema
import pytest
import torch
from wschat.server.engine.base import (
    Finished,
    Generation,
    GenerationRequest,
    Logprob,
    SamplingParams,
    TokenPiece,
)
from wschat.server.engine.errors import SchemaRefused
from wschat.server.engine.grammar import ResponseFormat
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.structured import BOUNDED
from tests.support import TIMEOUT, collect

FORMAT = ResponseFormat(BOUNDED, strict=True)


@pytest.fixture
async def batched(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=4, prefill_tokens=32))
    yield engine
    await engine.aclose()


def prompt(engine: HFEngine | BatchedEngine, n: int) -> list[int]:
    return [2, *engine.tokenize_text("tell me about colours " * (1 + 3 * n))]


async def pieces(generation: Generation) -> tuple[list[TokenPiece], Finished]:
    got: list[TokenPiece] = []
    async with asyncio.timeout(TIMEOUT):
        async for item in generation.items():
            if isinstance(item, TokenPiece):
                got.append(item)
            else:
                return got, item
    raise AssertionError("a generation ended without Finished")


@pytest.mark.parametrize("path", ["generate", "batched"])
async def test_a_constrained_reply_is_json_that_matches_its_schema_and_ends_at_a_stop(
    path: str, tiny_text_engine: HFEngine, batched: BatchedEngine
) -> None:
    engine = tiny_text_engine if path == "generate" else batched
    await engine.prepare_reply(SamplingParams(1, response_format=FORMAT))
    for params in (
        SamplingParams(max_new_tokens=64, response_format=FORMAT),
        SamplingParams(max_new_tokens=64, temperature=1.0, seed=7, response_format=FORMAT),
    ):
        text, finished = await collect(
            engine.generate(GenerationRequest(prompt(engine, 0), params))
        )
        assert finished.reason.value == "stop", text
        jsonschema.validate(json.loads(text), BOUNDED)
        assert finished.completion_ids[-1] in engine.prompt_format.end_ids


async def test_json_object_gives_an_object(tiny_text_engine: HFEngine) -> None:
    await tiny_text_engine.prepare_reply(SamplingParams(1, response_format=ResponseFormat()))
    params = SamplingParams(max_new_tokens=48, response_format=ResponseFormat())
    text, _ = await collect(
        tiny_text_engine.generate(GenerationRequest(prompt(tiny_text_engine, 1), params))
    )
    assert text.startswith("{")  # cut at max_new_tokens, an unbounded object need not close


async def test_unconstrained_rows_beside_a_constrained_one_get_their_replies_alone(
    batched: BatchedEngine,
) -> None:
    await batched.prepare_reply(SamplingParams(1, response_format=FORMAT))
    plain = SamplingParams(max_new_tokens=20)
    alone = [
        (await collect(batched.generate(GenerationRequest(prompt(batched, n), plain))))[0]
        for n in (1, 2, 3)
    ]
    constrained = SamplingParams(max_new_tokens=64, response_format=FORMAT)
    together = [
        batched.generate(GenerationRequest(prompt(batched, 0), constrained)),
        *(batched.generate(GenerationRequest(prompt(batched, n), plain)) for n in (1, 2, 3)),
    ]
    results = await asyncio.gather(*(collect(g) for g in together))
    jsonschema.validate(json.loads(results[0][0]), BOUNDED)
    assert [text for text, _ in results[1:]] == alone


async def test_a_reply_whose_format_was_never_prepared_fails_alone(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = HFEngine(tiny_text_loaded)
    params = SamplingParams(max_new_tokens=8, response_format=ResponseFormat({"type": "array"}))
    with pytest.raises(RuntimeError, match="was not prepared"):
        engine.generate(GenerationRequest(prompt(engine, 0), params))
    await engine.aclose()


async def test_a_schema_llguidance_cannot_enforce_is_refused_before_any_reply(
    tiny_text_engine: HFEngine,
) -> None:
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(SchemaRefused) as refused:
        await tiny_text_engine.prepare_reply(
            SamplingParams(1, response_format=ResponseFormat(unique, strict=True))
        )
    assert refused.value.message.startswith("response_format: the schema cannot be enforced: ")
    assert "uniqueItems" in refused.value.message


def flat(got: list[TokenPiece]) -> tuple[list[int], list[Logprob]]:
    ids = [i for piece in got for i in piece.ids]
    entries = [entry for piece in got for entry in piece.logprobs]
    return ids, entries


@pytest.mark.parametrize("path", ["generate", "batched"])
async def test_each_token_carries_the_models_logprob_and_its_most_probable_alternatives(
    path: str, tiny_text_engine: HFEngine, batched: BatchedEngine
) -> None:
    engine = tiny_text_engine if path == "generate" else batched
    ids = prompt(engine, 1)
    asked = SamplingParams(max_new_tokens=12, logprobs=5)
    got, finished = await pieces(engine.generate(GenerationRequest(ids, asked)))
    generated, entries = flat(got)
    assert [entry.chosen.id for entry in entries] == generated == list(finished.completion_ids)
    for entry in entries:
        assert len(entry.top) == 5
        values = [choice.logprob for choice in entry.top]
        assert values == sorted(values, reverse=True)
        assert entry.chosen.id == entry.top[0].id  # greedy: the most probable
        assert entry.chosen.logprob == pytest.approx(values[0])
        assert entry.chosen.text == tiny_text_engine.token_texts.of(entry.chosen.id)[0]
    # the model's distribution: the first token's, from a forward of the prompt
    with torch.inference_mode():
        logits = tiny_text_engine.model(torch.tensor([ids])).logits[0, -1].float()
    expected = torch.log_softmax(logits, -1)
    assert entries[0].chosen.logprob == pytest.approx(float(expected[generated[0]]), abs=1e-4)
    plain, _ = await collect(
        engine.generate(GenerationRequest(ids, SamplingParams(max_new_tokens=12)))
    )
    assert "".join(piece.text for piece in got) == plain  # asking changes nothing of the reply


async def test_logprobs_under_a_grammar_are_the_models_before_its_mask(
    batched: BatchedEngine,
) -> None:
    await batched.prepare_reply(SamplingParams(1, response_format=FORMAT))
    params = SamplingParams(max_new_tokens=64, response_format=FORMAT, logprobs=0)
    ids = prompt(batched, 0)
    got, finished = await pieces(batched.generate(GenerationRequest(ids, params)))
    generated, entries = flat(got)
    assert len(entries) == len(generated) and all(entry.top == () for entry in entries)
    assert all(math.isfinite(e.chosen.logprob) and e.chosen.logprob <= 0 for e in entries)
    assert entries[0].chosen.text.startswith("{") and finished.reason.value == "stop"
    with torch.inference_mode():
        logits = batched.model(torch.tensor([ids])).logits[0, -1].float()
    model_says = float(torch.log_softmax(logits, -1)[generated[0]])
    assert entries[0].chosen.logprob == pytest.approx(model_says, abs=1e-4)
    assert model_says < float(logits.log_softmax(-1).max())  # the mask, not the model, chose it

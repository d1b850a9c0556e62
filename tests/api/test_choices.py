"""``n`` choices on ``/v1/chat/completions`` and ``/v1/completions`` through the official ``openai``
SDK against a real uvicorn on the tiny model's batched engine: each choice is the reply its own
seed gives alone, the usage counts the prompt once, the prompt is prefilled once for all the
choices, streamed chunks name their choice, and ``n`` out of range is a 400."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.api.support import async_client, user
from tests.support import TIMEOUT, http_base, running_server


@pytest.fixture
async def batched(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=4, prefill_tokens=64))
    yield engine
    await engine.aclose()


ASK: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 5}


async def test_three_choices_are_each_seeds_reply_with_the_prompt_prefilled_once(
    batched: BatchedEngine,
) -> None:
    async with running_server(batched) as url, async_client(url) as client:
        alone = [
            await client.chat.completions.create(
                model="m", messages=[user("Pick a word")], **(ASK | {"seed": 5 + i})
            )
            for i in range(3)
        ]
        before = batched.prefilled_tokens
        three = await client.chat.completions.create(
            model="m", messages=[user("Pick a word")], n=3, **ASK
        )
        prefilled = batched.prefilled_tokens - before
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert texts == [a.choices[0].message.content for a in alone]
    assert len(set(texts)) > 1  # three seeds, three replies
    assert three.usage is not None and alone[0].usage is not None
    prompt = alone[0].usage.prompt_tokens
    assert three.usage.prompt_tokens == prompt  # counted once
    assert three.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert prefilled == prompt  # once, for all three


async def test_streamed_choices_name_their_index_and_end_with_one_usage_chunk(
    batched: BatchedEngine,
) -> None:
    async with running_server(batched) as url, async_client(url) as client:
        whole = await client.completions.create(model="m", prompt="Once", n=2, **ASK)
        stream = await client.completions.create(
            model="m",
            prompt="Once",
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            **ASK,
        )
        parts: dict[int, list[str]] = {0: [], 1: []}
        usages = []
        async with asyncio.timeout(TIMEOUT):
            async for chunk in stream:
                for choice in chunk.choices:
                    parts[choice.index].append(choice.text)
                if chunk.usage is not None:
                    usages.append(chunk.usage)
    assert ["".join(parts[i]) for i in (0, 1)] == [c.text for c in whole.choices]
    assert len(usages) == 1 and whole.usage is not None
    assert usages[0].completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("n", [0, 9, "2", 1.0])
async def test_n_out_of_range_is_invalid_params(batched: BatchedEngine, n: Any) -> None:
    async with running_server(batched) as url, httpx.AsyncClient(timeout=TIMEOUT) as client:
        answer = await client.post(
            f"{http_base(url)}/v1/chat/completions",
            json={"model": "m", "messages": [user("Hi")], "n": n},
        )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_params", "n")
    assert error["message"] == "n must be an integer from 1 to 8"

"""The embedded Gemma 3 270M through the Responses API's WebSocket mode (the SDK's
``responses.connect()``): a two-turn conversation continued by ``previous_response_id`` gets
the replies the msgpack WebSocket gets for the same turns, token for token, and its second turn
reads the first from the KV cache; a strict ``text.format`` reply parses into a pydantic model
(the SDK's ``responses.parse``), as the chat API's ``response_format`` does."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel

from tests.api.support import async_client, websocket_replies
from tests.support import running_server

pytestmark = pytest.mark.real_model

TURNS = ["What is the capital of France?", "And of Italy?"]
TOKENS = 24


async def socket_replies(client: openai.AsyncOpenAI) -> list[Any]:
    responses: list[Any] = []
    async with client.responses.connect() as connection:
        for text in TURNS:
            previous = responses[-1].id if responses else openai.omit
            await connection.response.create(
                model="embedded",
                input=text,
                max_output_tokens=TOKENS,
                store=False,
                previous_response_id=previous,
            )
            async with asyncio.timeout(300):
                async for event in connection:
                    if event.type in ("response.completed", "response.incomplete", "error"):
                        break
            assert event.type != "error", event
            responses.append(event.response)
    return responses


async def test_a_continuation_on_the_socket_is_the_msgpack_sessions_conversation(
    embedded: LoadedModel,
) -> None:
    async with asyncio.timeout(600):  # compiles the int8 head on first use (minutes)
        engine = await asyncio.to_thread(BatchedEngine, embedded)
    try:
        async with running_server(engine) as url, async_client(url) as client:
            dones = await websocket_replies(url, TURNS, max_new_tokens=TOKENS)
            responses = await socket_replies(client)
    finally:
        await engine.aclose()
    assert [r.output_text for r in responses] == [d["text"] for d in dones]
    assert "Paris" in responses[0].output_text
    first, second = (r.usage for r in responses)
    assert second.input_tokens == dones[1]["usage"]["prompt_tokens"]
    assert second.input_tokens_details.cached_tokens >= first.input_tokens + first.output_tokens - 1


async def test_a_strict_text_format_reply_parses_into_a_pydantic_model(
    embedded: LoadedModel,
) -> None:
    from tests.api.test_structured_output import Fruit

    async with asyncio.timeout(600):
        engine = await asyncio.to_thread(BatchedEngine, embedded)
    try:
        async with running_server(engine) as url, async_client(url) as client:
            for text in ("Describe a banana.", "Describe a cherry."):
                response = await client.responses.parse(
                    model="embedded", input=text, text_format=Fruit, max_output_tokens=96
                )
                assert response.status == "completed", response.output_text
                assert isinstance(response.output_parsed, Fruit)
    finally:
        await engine.aclose()

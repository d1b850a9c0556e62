"""The API with ``--engine openai`` in front of llama.cpp (the ``llama`` fixture): we are then a
gateway that adds tokens, limits and metrics in front of another server's engine, and a
request still runs as a session's prompt does, with its usage and the remote cache's count."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import openai
from wschat.server.runtime.llamacpp import EMBEDDED_ALIAS

from tests.api.support import assistant, async_client, user
from tests.support import TIMEOUT, http_base, running_server

if TYPE_CHECKING:
    from wschat.server.engine.openai import OpenAIEngine


async def test_a_streamed_conversation_through_the_gateway_reuses_the_remote_prefix(
    openai_engine: OpenAIEngine,
) -> None:
    async with running_server(openai_engine) as url, async_client(url) as client:
        first = await client.chat.completions.create(
            model="any", messages=[user("What is the capital of Italy?")], max_tokens=16
        )
        reply = first.choices[0].message.content or ""
        stream = await client.chat.completions.create(
            model="any",
            messages=[user("What is the capital of Italy?"), assistant(reply), user("And Spain?")],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    usage = chunks[-1].usage
    assert reply and text
    assert usage is not None and usage.prompt_tokens_details is not None
    assert first.usage is not None
    assert usage.prompt_tokens > first.usage.prompt_tokens
    # the first request's prompt was the remote engine's to keep: the second starts with it
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= first.usage.prompt_tokens - 1


async def test_readyz_of_a_gateway_names_the_engines_kind_host_and_model_not_a_device(
    openai_engine: OpenAIEngine,
) -> None:
    async with running_server(openai_engine) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        answer = await http.get(f"{http_base(url)}/readyz")
    assert answer.status_code == 200
    assert answer.json() == {
        "ready": True,
        "model": EMBEDDED_ALIAS,
        "engine": "openai",
        "remote": {"kind": "llama.cpp", "host": "127.0.0.1", "model": EMBEDDED_ALIAS},
    }


async def test_a_continuation_on_the_responses_socket_through_the_gateway_reuses_the_prefix(
    openai_engine: OpenAIEngine,
) -> None:
    """The Responses API's WebSocket mode in front of llama.cpp: a turn continued by
    ``previous_response_id`` is sent to the engine whole, and its prefix is the remote cache's."""
    async with running_server(openai_engine) as url, async_client(url) as client:
        responses: list[Any] = []
        async with client.responses.connect() as connection:
            for text in ("What is the capital of Italy?", "And Spain?"):
                await connection.response.create(
                    model="any",
                    input=text,
                    max_output_tokens=16,
                    store=False,
                    previous_response_id=responses[-1].id if responses else openai.omit,
                )
                async with asyncio.timeout(TIMEOUT):
                    async for event in connection:
                        if event.type in ("response.completed", "response.incomplete", "error"):
                            break
                assert event.type != "error", event
                responses.append(event.response)
    first, second = (r.usage for r in responses)
    assert responses[0].output_text and responses[1].output_text
    assert second.input_tokens > first.input_tokens
    assert second.input_tokens_details.cached_tokens >= first.input_tokens - 1


async def test_a_text_format_reply_through_the_gateway_parses_into_a_pydantic_model(
    openai_engine: OpenAIEngine,
) -> None:
    """``text.format`` goes to llama.cpp as its schema (reply_fields.py), which holds the reply:
    the SDK's ``responses.parse`` gives the model."""
    from tests.api.test_responses_format import Choice

    async with running_server(openai_engine) as url, async_client(url) as client:
        # llama.cpp's schema-held sampling is slow on two busy cores (18 tokens took 21 s)
        parsed = await client.with_options(timeout=300).responses.parse(
            model="any", input="Pick a colour.", text_format=Choice, max_output_tokens=32
        )
    assert parsed.status == "completed", parsed.output_text
    assert isinstance(parsed.output_parsed, Choice)

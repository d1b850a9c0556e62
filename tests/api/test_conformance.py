"""The same conversation through both APIs is the same prompt, and on the batched engine the same
replies: on each engine the API is served from besides the generate engine (the other tests'
own): the batched engine (the tiny model) and the openai engine in front of llama.cpp, whose
replies to one prompt vary with what its prompt cache held before, so there only the prompt and
a first reply are compared."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from tests.api.support import assistant, async_client, user, websocket_replies
from tests.support import running_server

if TYPE_CHECKING:
    from wschat.server.engine import Engine


@pytest.fixture(params=("batched", "openai"))
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str]]:
    """The chat URL of a server on the engine the parameter names, and that name."""
    engine: Engine
    if request.param == "openai":
        request.getfixturevalue("live_llama")
        engine = request.getfixturevalue("connected_openai")
    else:
        from wschat.server.engine.local.batched import BatchedEngine
        from wschat.server.engine.local.options import LocalEngineOptions
        from wschat.server.engine.local.threads import ThreadPolicy

        loaded = request.getfixturevalue("tiny_text_loaded")
        engine = BatchedEngine(loaded, LocalEngineOptions(width=2), threads=ThreadPolicy(1))
    try:
        async with running_server(engine) as url:
            yield url, request.param
    finally:
        await engine.aclose()


async def test_a_conversation_gets_the_same_replies_through_both_apis(
    served: tuple[str, str],
) -> None:
    url, engine = served
    texts = ["What is the capital of Italy?", "And of France?"]
    ws = await websocket_replies(url, texts, max_new_tokens=10)
    async with async_client(url) as client:
        first = await client.chat.completions.create(
            model="any", messages=[user(texts[0])], max_tokens=10
        )
        second = await client.chat.completions.create(
            model="any",
            messages=[user(texts[0]), assistant(ws[0]["text"]), user(texts[1])],
            max_tokens=10,
        )
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens == ws[0]["usage"]["prompt_tokens"]
    assert second.usage.prompt_tokens == ws[1]["usage"]["prompt_tokens"]
    assert first.choices[0].message.content == ws[0]["text"]
    if engine == "batched":
        assert second.choices[0].message.content == ws[1]["text"]

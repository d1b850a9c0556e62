"""``chat_url``: a real server on each engine the protocol is served from, so the same tests
hold every engine to PROTOCOL.md; ``forget_engine_cache`` for the tests that compare replies.
The tiny random model runs on the batched and the generate engines; the openai engine is in
front of llama.cpp's server on the embedded GGUF (started once per run: the ``llama``
fixture)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import pytest

from tests.support import running_server

if TYPE_CHECKING:
    from wschat.server.engine import Engine

ENGINES = ("batched", "generate", "openai")


def _engine(name: str, request: pytest.FixtureRequest) -> Engine:
    if name == "openai":
        request.getfixturevalue("live_llama")  # up again if a test before this one stopped it
        engine: Engine = request.getfixturevalue("connected_openai")
        return engine
    loaded = request.getfixturevalue("tiny_text_loaded")
    if name == "batched":
        from wschat.server.engine.local.batched import BatchedEngine
        from wschat.server.engine.local.options import LocalEngineOptions

        return BatchedEngine(loaded, LocalEngineOptions(width=2))
    from wschat.server.engine.local.hf import HFEngine

    return HFEngine(loaded)


@pytest.fixture(params=ENGINES)
async def chat_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """``ws://.../v1/chat`` of a server on the engine named by the parameter; the engine is
    closed after (the shared openai engine only closes its HTTP client, as ``openai_engine``)."""
    engine = _engine(request.param, request)
    try:
        async with running_server(engine) as url:
            yield url
    finally:
        await engine.aclose()


@pytest.fixture
def forget_engine_cache(
    chat_url: str, request: pytest.FixtureRequest
) -> Callable[[], Awaitable[None]]:
    """Drop what the engine behind ``chat_url`` keeps of earlier prompts. llama.cpp computes a
    reused prefix in other batch shapes than a whole prefill, so a greedy reply may part from
    a fresh one's after a near tie (its prompt cache off, they agree): erasing its slots lets a
    test compare the prompts we send by their replies. The in-process engines' reuse is exact,
    so there it does nothing and the reuse stays under test."""
    engine = request.node.callspec.params["chat_url"]
    llama = request.getfixturevalue("live_llama") if engine == "openai" else None

    async def forget() -> None:
        if llama is not None:
            await asyncio.to_thread(llama.erase_slots)

    return forget

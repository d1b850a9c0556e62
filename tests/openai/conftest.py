from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from wschat.server.engine.openai import OpenAIEngine, connect

from tests.openai.llama import LlamaServer, llama_server
from tests.support import free_port


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama.cpp server for a test module; a test that kills it starts it again."""
    log = tmp_path_factory.mktemp("llama") / "llama.log"
    with llama_server(free_port(), log) as server:
        yield server


@pytest.fixture
def live_llama(llama: LlamaServer) -> LlamaServer:
    if llama.process is None or llama.process.poll() is not None:
        llama.start()  # a test before this one stopped it
    return llama


@pytest.fixture
async def openai_engine(live_llama: LlamaServer) -> AsyncIterator[OpenAIEngine]:
    engine = await asyncio.to_thread(connect, live_llama.config())
    try:
        yield engine
    finally:
        await engine.aclose()

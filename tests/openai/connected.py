"""The openai engine in front of a fake engine (``tests/fakes/openai_engine.py``), connected as
the CLI connects it: the embedded tokenizer, the gemma-turns format (or ``prompt_format``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai import OpenAIEngine, OpenAIEngineConfig, connect
from wschat.server.engine.openai.dialect import AUTO

from tests.fakes.openai_engine import MisbehavingEngine


@contextlib.asynccontextmanager
async def connected(
    engine: MisbehavingEngine, dialect: str = AUTO, prompt_format: str = "gemma-turns"
) -> AsyncIterator[OpenAIEngine]:
    """``connect`` (in a thread, as the server's loading does) to ``engine``; closed after."""
    config = OpenAIEngineConfig(
        url=engine.api_url,
        tokenizer="embedded",
        cache_dir=default_cache_dir(),
        prompt_format=prompt_format,
        dialect=dialect,
    )
    remote = await asyncio.to_thread(connect, config)
    try:
        yield remote
    finally:
        await remote.aclose()

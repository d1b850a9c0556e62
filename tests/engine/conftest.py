"""Fixtures shared by the engine tests (``batched``: in ``test_batched.py`` and
``test_batched_server.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.engine.batch_runs import WIDTH


@pytest.fixture
async def batched(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    """The batched engine over the tiny text model, ``WIDTH`` rows wide, prefilling in chunks of
    32 tokens."""
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=WIDTH, prefill_tokens=32))
    yield engine
    await engine.aclose()

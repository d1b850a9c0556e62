"""The API tests' engine: the tiny text model on one thread, so that replies compared across
requests are computed alike whatever the machine's load (``auto`` follows other processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine
    from wschat.server.engine.local.loader import LoadedModel


@pytest.fixture
async def tiny_engine(tiny_text_loaded: LoadedModel) -> AsyncIterator[HFEngine]:
    from wschat.server.engine.local.hf import HFEngine
    from wschat.server.engine.local.threads import ThreadPolicy

    engine = HFEngine(tiny_text_loaded, threads=ThreadPolicy(1))
    yield engine
    await engine.aclose()


@pytest.fixture
async def tiny_vision(tiny_vision_loaded: LoadedModel) -> AsyncIterator[HFEngine]:
    from wschat.server.engine.local.hf import HFEngine
    from wschat.server.engine.local.threads import ThreadPolicy

    engine = HFEngine(tiny_vision_loaded, threads=ThreadPolicy(1))
    yield engine
    await engine.aclose()

"""``Hub``: the generation slots follow the engine's batch width under ``--max-concurrent auto``
and keep the asked number otherwise."""

from __future__ import annotations

from dataclasses import replace

import pytest
from wschat.server.sessions.hub import Hub
from wschat.server.settings import UNBATCHED_CONCURRENT, Settings

from tests.fakes.scripted import ScriptedEngine


def engine(batch_width: int | None) -> ScriptedEngine:
    scripted = ScriptedEngine()
    scripted.info = replace(scripted.info, batch_width=batch_width)
    return scripted


@pytest.mark.parametrize(
    ("asked", "batch_width", "slots"),
    [
        (None, 24, 24),  # auto: the engine's width
        (None, None, UNBATCHED_CONCURRENT),  # auto, an engine that does not batch
        (5, 24, 5),  # asked: what was asked, whatever the engine's width
    ],
)
async def test_the_slots_take_the_engines_batch_width_only_under_auto(
    asked: int | None, batch_width: int | None, slots: int
) -> None:
    hub = Hub(Settings(max_concurrent=asked))
    hub.set_engine(engine(batch_width))
    assert hub.slots.max_concurrent == slots

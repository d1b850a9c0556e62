"""Turns on either local engine (``generate`` or batched) for the KV reuse tests: an engine
made (a fixture of each in turn), a user turn's ids, a run's text and finish, the KV bytes a
number of positions takes, a prompt over a server, the tiny model with a wider window."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from wschat.server.engine.base import Finished, Generation, GenerationRequest, SamplingParams
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel, load_model
from wschat.server.engine.local.options import LocalEngineOptions

from tests.support import RawPeer, collect

Engine = HFEngine | BatchedEngine
WINDOW = 16  # the tiny model's sliding window


def make_engine(loaded: LoadedModel, kind: str, **options: Any) -> Engine:
    """The ``generate`` or the batched engine over ``loaded`` (prefills in chunks of 32)."""
    if kind == "generate":
        return HFEngine(loaded, LocalEngineOptions(**options))
    return BatchedEngine(loaded, LocalEngineOptions(prefill_tokens=32, **options))


def engine_fixture(loaded: str) -> Any:
    """A fixture that gives each local engine in turn over the model of the fixture ``loaded``
    (``make_engine``'s), and closes it after the test."""

    @pytest.fixture(params=["generate", "batched"])
    async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
        made = make_engine(request.getfixturevalue(loaded), request.param)
        yield made
        await made.aclose()

    return engine


async def run(engine: Engine, ids: list[int], key: str | None, tokens: int = 10) -> Finished:
    return (await run_text(engine, ids, key, tokens))[1]


async def run_text(
    engine: Engine, ids: list[int], key: str | None, tokens: int = 10
) -> tuple[str, Finished]:
    generation: Generation = engine.generate(
        GenerationRequest(ids, SamplingParams(max_new_tokens=tokens), session_key=key)
    )
    return await collect(generation)


def user_turn(engine: Engine, text: str) -> list[int]:
    """``<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n`` as conversation.py
    lays it out."""
    return [
        105,
        *engine.tokenize_text(f"user\n{text}"),
        106,
        *engine.tokenize_text("\n"),
        105,
        *engine.tokenize_text("model\n"),
    ]


def sessions_cached(engine: Engine) -> set[str]:
    store = engine.kv
    return set(store.sessions())


def kv_bytes(loaded: LoadedModel, positions: int, *, full: bool = True) -> int:
    """Keys and values of ``positions`` tokens from the model's layers, heads and dtype: a
    full-attention layer holds every position, a sliding one at most its window (``full``
    False: the sliding layers alone, a ring mark)."""
    text = loaded.model.config.get_text_config()
    per_position = 2 * text.num_key_value_heads * text.head_dim * loaded.dtype.itemsize
    held = [
        (positions if full else 0)
        if kind == "full_attention"
        else min(positions, text.sliding_window)
        for kind in text.layer_types
    ]
    return int(per_position * sum(held))


async def ask(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


def load_widened(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A copy of the tiny model in ``model_dir`` whose sliding window (512) is wider than the
    prompts of a test, loaded in float32."""
    target = tmp_path_factory.mktemp("wide-window") / "model"
    shutil.copytree(model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config.get("text_config", config)["sliding_window"] = 512
    (target / "config.json").write_text(json.dumps(config))
    return load_model(str(target), dtype="float32")

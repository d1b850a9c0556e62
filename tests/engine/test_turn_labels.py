"""A transcript reply spans lines and ends where the model begins the next turn, on both local
engines (``generate`` and the batched engine) over a real server: the label is never streamed,
the next prompt reuses the cached reply, and a long reply can be cancelled mid-way.

The model is the tiny Gemma 3 scripted to write a known text (tests/engine/bigram.py):
``Assistant:`` is followed by `` Red``, a line break, `` Blue``, a blank line and ``User:``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from wschat.server.engine.base import Engine
from wschat.server.engine.formats import TokenizerCodec, Transcript, newline_ids
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel, load_model
from wschat.server.engine.local.options import LocalEngineOptions

from tests.engine.bigram import build_bigram_model
from tests.support import RawPeer, raw_peer, running_server

SCRIPT = {":": " Red", " Red": "\n", "\n": " Blue", " Blue": "\n\n", "\n\n": "User", "User": ":"}
REPLY = "Red\n Blue"  # then "\n\nUser:", where the next turn begins
LONG = 400  # max_new_tokens of a reply that must still be running when cancelled


@pytest.fixture(scope="module")
def scripted_loaded(tiny_text_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = build_bigram_model(tiny_text_dir, tmp_path_factory.mktemp("bigram"), SCRIPT)
    return load_model(str(path), dtype="float32")


def with_labels(engine: Any, labels: tuple[str, str]) -> None:
    """Render the engine's prompts with other turn labels (the batched engine's image path
    reads the same ``LocalModel.prompt_format``)."""
    tokenizer = engine.tokenizer
    fmt = Transcript(
        TokenizerCodec(tokenizer), frozenset({1}), newline_ids(tokenizer), labels=labels
    )
    engine.prompt_format = fmt


@pytest.fixture(params=["generate", "batched"])
async def engine(
    request: pytest.FixtureRequest, scripted_loaded: LoadedModel
) -> AsyncIterator[Any]:
    kind = HFEngine if request.param == "generate" else BatchedEngine
    built: Engine = kind(scripted_loaded, LocalEngineOptions(prompt_format="transcript"))
    yield built
    await built.aclose()


async def ask(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


def streamed(frames: list[dict[str, Any]]) -> list[str]:
    return [f["text"] for f in frames if f["type"] == "token"]


async def test_a_reply_spans_lines_and_ends_at_the_next_turns_label_without_streaming_it(
    engine: Any,
) -> None:
    assert engine.prompt_format.name == "transcript"
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        first = await ask(peer, "a", "Two colors?", max_new_tokens=40, temperature=0)
        second = await ask(peer, "b", "Again?", max_new_tokens=40, temperature=0)
    for frames in (first, second):
        done = frames[-1]
        assert (done["reason"], done["text"]) == ("stop", REPLY)
        assert "".join(streamed(frames)) == REPLY
        assert not any("User" in text or text.endswith("\n") for text in streamed(frames))
        assert done["usage"]["completion_tokens"] == 6  # Red \n Blue \n\n User :
    # the reply is kept to its blank line and the label is the next turn's: the second prompt
    # extends what the engine cached after the first, the reply's ids included
    start = second[0]
    assert start["type"] == "start" and start["cached_tokens"] >= first[0]["prompt_tokens"] + 4


async def test_a_long_reply_over_many_lines_is_cancelled_mid_way(engine: Any) -> None:
    with_labels(engine, ("Human:", "AI:"))  # "User:" is plain text now: the reply never ends
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(
            {"type": "prompt", "id": "a", "text": "Go on", "params": {"max_new_tokens": LONG}}
        )
        frames: list[dict[str, Any]] = []
        while "".join(streamed(frames)).count("\n") < 6:
            frames.append(await peer.recv())
            assert frames[-1]["type"] in ("start", "token"), frames[-1]
        await peer.send({"type": "cancel", "id": "a"})
        frames += await peer.recv_until("done")
    done = frames[-1]
    assert done["reason"] == "cancelled"
    assert done["text"].startswith(f"{REPLY}\n\nUser: Red\n Blue\n\nUser")
    assert done["text"] == "".join(streamed(frames))
    assert done["usage"]["completion_tokens"] < LONG

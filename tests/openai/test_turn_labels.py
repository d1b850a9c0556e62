"""The openai engine (``--engine openai``, ``--engine llamacpp``) renders a transcript itself, so
it ends a reply where the model begins the next turn as the local engines do: it asks the engine
to stop on the turn labels, and an engine that streams on past one (or streams its start before
it stops) shows the client none of it."""

from __future__ import annotations

from typing import Any

import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai.dialect import LLAMA_CPP, VLLM
from wschat.server.engine.openai.tokenizer import (
    GatewayTokenizer,
    load_tokenizer,
)

from tests.fakes.openai_engine import Answer, endless, misbehaving_engine, token
from tests.openai.connected import connected
from tests.support import raw_peer, running_server

PIECES = ("Red", "\n", "Blue", "\n\n", "User", ":", " And", " more")


@pytest.fixture(scope="module")
def tokenizer() -> GatewayTokenizer:
    return load_tokenizer("embedded", default_cache_dir())


@pytest.mark.parametrize("dialect", [LLAMA_CPP, VLLM])
async def test_a_reply_ends_at_the_next_turns_label_that_the_engine_streamed(
    tokenizer: GatewayTokenizer, dialect: str
) -> None:
    pieces = [(text, tokenizer.tokenize_text(text)) for text in PIECES]
    assert all(len(ids) == 1 for _, ids in pieces)

    def script(path: str, body: dict[str, Any]) -> Answer:
        # an engine that ignores its stop strings: the turn goes on, then tokens for ever
        after = endless(dialect, " on", pieces[-1][1][0]).body
        return Answer([*(token(dialect, t, ids) for t, ids in pieces), *after])

    async with (
        misbehaving_engine(dialect, script) as engine,
        connected(engine, dialect, "transcript") as remote,
        running_server(remote) as url,
        raw_peer(url) as (peer, _),
    ):
        params = {"max_new_tokens": 64, "stop": ["never"]}
        await peer.send({"type": "prompt", "id": "a", "text": "Colors?", "params": params})
        frames = await peer.recv_until("done")
        (served,) = [await s.end() for s in engine.served]
    done = frames[-1]
    texts = [f["text"] for f in frames if f["type"] == "token"]
    assert (done["reason"], done["text"]) == ("stop", "Red\nBlue")
    assert "".join(texts) == "Red\nBlue" and not any("User" in t for t in texts)
    assert done["usage"]["completion_tokens"] == 6  # up to the label's ":", where it was read
    assert served.body["stop"] == ["never", "\nUser:", "\nAssistant:"]
    assert served.closed_early  # the stream was closed at the label

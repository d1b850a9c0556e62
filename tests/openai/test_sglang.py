"""wschat in front of an engine that speaks as SGLang's server does (the fake of
``tests/fakes/openai_engine.py`` in SGLang's spellings, as its source reads them: no SGLang runs
here). The dialect is told by
``/v1/models``' owner or named; ``/tokenize`` checks the tokenizer; ``/model_info`` says the
model reads images; a text prompt goes to ``/v1/completions`` as ids with SGLang's fields, and
its reply's ids and cached prompt tokens come back; an image prompt goes to the chat API, whose
text comes without ids; a reply the engine aborts, or an error chunk, ends as ``internal``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai import OpenAIEngine
from wschat.server.engine.openai.dialect import AUTO, SGLANG, VLLM
from wschat.server.engine.openai.startup import DETECTED_MAX_IMAGES
from wschat.server.engine.openai.tokenizer import (
    GatewayTokenizer,
    load_tokenizer,
)

from tests.fakes.openai_engine import (
    CHAT_PATH,
    Answer,
    MisbehavingEngine,
    chat_text,
    last,
    misbehaving_engine,
    sse,
    token,
)
from tests.images import samples
from tests.openai.connected import connected
from tests.support import RawPeer, raw_peer, running_server

CACHED = 3  # prompt tokens the engine says it found in its cache
CHAT_REPLY = "A red square."
ENGINE_CONTEXT = 4096


@pytest.fixture(scope="module")
def tokenizer() -> GatewayTokenizer:
    return load_tokenizer("embedded", default_cache_dir())


class Sglang:
    """What SGLang's server answers: a text prompt's reply in chunks with ``token_ids`` (the
    prompt's ids on the first), ``finish_reason``, then a usage chunk with the cached prompt
    tokens; a chat reply as text alone. ``answers`` go first, in order."""

    def __init__(self, tokenizer: GatewayTokenizer, *answers: Answer) -> None:
        self.tokenizer = tokenizer
        self.answers = list(answers)

    def __call__(self, path: str, body: dict[str, Any]) -> Answer:
        if self.answers:
            return self.answers.pop(0)
        if path == CHAT_PATH:
            return Answer([chat_text("A red"), chat_text(" square."), last(SGLANG, CACHED)])
        ids = self.tokenizer.tokenize_text("Paris.")
        first = {"index": 0, "text": "Paris", "token_ids": ids[:1], "finish_reason": None}
        first |= {"prompt_token_ids": body["prompt"], "matched_stop": None}
        chunks = [sse({"choices": [first]}), token(SGLANG, ".", ids[1:]), last(SGLANG, CACHED)]
        return Answer(chunks)

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/tokenize``, in SGLang's fields: the text as ids, without special tokens."""
        assert body.get("add_special_tokens") is False, body
        ids = self.tokenizer.tokenize_text(body["prompt"])
        return {"tokens": ids, "count": len(ids), "max_model_len": ENGINE_CONTEXT}


def model_info(body: dict[str, Any]) -> dict[str, Any]:
    return {"model_path": "gemma-3", "is_generation": True, "has_image_understanding": True}


@contextlib.asynccontextmanager
async def sglang(
    tokenizer: GatewayTokenizer, *answers: Answer, owner: str | None = None, dialect: str = AUTO
) -> AsyncIterator[tuple[MisbehavingEngine, OpenAIEngine]]:
    """The SGLang-shaped engine, and wschat's openai engine connected to it as the CLI does."""
    script = Sglang(tokenizer, *answers)
    routes = {"/tokenize": script.tokenize, "/model_info": model_info}
    async with (
        misbehaving_engine(
            SGLANG, script, context_tokens=ENGINE_CONTEXT, routes=routes, owner=owner
        ) as engine,
        connected(engine, dialect) as remote,
    ):
        yield engine, remote


async def ask(peer: RawPeer, frame_id: str, **fields: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": "Hello", **fields})
    return await peer.recv_until("done")


async def test_sglang_is_told_by_its_owner_and_spoken_to_in_its_spellings_through_a_session(
    tokenizer: GatewayTokenizer,
) -> None:
    async with sglang(tokenizer) as (engine, remote):
        assert remote.dialect.name == SGLANG and remote.info.context_tokens == ENGINE_CONTEXT
        assert remote.info.max_images == DETECTED_MAX_IMAGES  # from /model_info
        async with running_server(remote) as url, raw_peer(url) as (peer, _):
            params = {"seed": -1, "repetition_penalty": 1.1, "max_new_tokens": 16}
            text = await ask(peer, "a", params=params)
            image = await ask(peer, "b", images=[samples.png(48, 32)])
            after = await ask(peer, "c")
    done = text[-1]
    assert (done["reason"], done["text"]) == ("stop", "Paris.")
    assert done["usage"]["cached_tokens"] == CACHED
    assert done["usage"]["completion_tokens"] == len(tokenizer.tokenize_text("Paris."))
    sent = engine.served[0]
    assert sent.path == "/v1/completions" and all(type(i) is int for i in sent.body["prompt"])
    assert sent.body["return_token_ids"] is True and sent.body["stream_options"]["include_usage"]
    assert (sent.body["top_k"], sent.body["repetition_penalty"]) == (-1, 1.1)
    assert sent.body["seed"] == (1 << 31) - 1  # -1, as a signed 32-bit seed
    assert tokenizer.token_id("<end_of_turn>") in sent.body["stop_token_ids"]
    # the chat API's text came without ids: the gateway tokenized it
    assert (image[-1]["reason"], image[-1]["text"]) == ("stop", CHAT_REPLY)
    assert image[-1]["usage"]["completion_tokens"] == len(tokenizer.tokenize_text(CHAT_REPLY))
    chat = engine.served[1]
    assert chat.path == CHAT_PATH and "return_token_ids" not in chat.body
    assert "logprobs" not in chat.body
    parts = chat.body["messages"][-1]["content"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    # the conversation holds an image now: the next prompt goes through the chat API too
    assert after[-1]["reason"] == "stop" and engine.served[2].path == CHAT_PATH
    assert CHAT_REPLY in json.dumps(engine.served[2].body["messages"])


@pytest.mark.parametrize(("dialect", "spoken"), [(SGLANG, SGLANG), (AUTO, VLLM)])
async def test_a_named_dialect_is_spoken_whatever_owner_the_engine_lists(
    tokenizer: GatewayTokenizer, dialect: str, spoken: str
) -> None:
    async with sglang(tokenizer, owner="proxy", dialect=dialect) as (_, remote):
        assert remote.dialect.name == spoken


@pytest.mark.parametrize(
    "failure",
    [
        sse({"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "abort"}]}),
        # an error after the stream began, as some releases write it: no "error" key
        sse({"object": "error", "message": "out of memory", "type": "Internal", "code": 500}),
    ],
    ids=["abort", "error-object"],
)
async def test_a_reply_sglang_gives_up_ends_as_internal_and_the_session_goes_on(
    tokenizer: GatewayTokenizer, failure: bytes
) -> None:
    answer = Answer([token(SGLANG, "Par", tokenizer.tokenize_text("Par")), failure])
    async with (
        sglang(tokenizer, answer) as (_, remote),
        running_server(remote) as url,
        raw_peer(url) as (peer, _),
    ):
        frames = await ask(peer, "a")
        after = await ask(peer, "b")
    assert [f["type"] for f in frames[-2:]] == ["error", "done"], json.dumps(frames[-2:])
    assert frames[-2]["code"] == "internal" and frames[-1]["reason"] == "error"
    assert (after[-1]["reason"], after[-1]["text"]) == ("stop", "Paris.")

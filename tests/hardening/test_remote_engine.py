"""A remote engine that misbehaves (``tests/fakes/openai_engine.py``), in llama.cpp's words and in
vLLM's, behind a real wschat: tokens past the limit are not taken and the stream is closed; a
number out of range, a line, a chunk's text or an error body over its byte limit end the reply
with ``internal`` then ``done``, and the session goes on."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai import OpenAIEngine
from wschat.server.engine.openai.client import ERROR_BODY_BYTES, EngineHttp
from wschat.server.engine.openai.dialect import LLAMA_CPP, VLLM, Dialect
from wschat.server.engine.openai.engine import CHUNK_TEXT_BYTES
from wschat.server.engine.openai.startup import gateway_format
from wschat.server.engine.openai.tokenizer import (
    GatewayTokenizer,
    load_tokenizer,
)

from tests.fakes.openai_engine import (
    MODEL,
    Answer,
    MisbehavingEngine,
    endless,
    last,
    megabytes,
    misbehaving_engine,
    reply,
    token,
)
from tests.prometheus import samples
from tests.support import RawPeer, http_base, raw_peer, running_server

DIALECTS = [LLAMA_CPP, VLLM]
# what the engine may have written before the reply was closed: the limit and the socket buffers
WRITTEN_AT_MOST = 24 << 20


@pytest.fixture(scope="module")
def tokenizer() -> GatewayTokenizer:
    return load_tokenizer("embedded", default_cache_dir())


def gateway(engine: MisbehavingEngine, tokenizer: GatewayTokenizer) -> OpenAIEngine:
    """The openai engine in front of ``engine``, as ``connect`` builds it."""
    return OpenAIEngine(
        EngineHttp(engine.api_url, None),
        Dialect.named(engine.dialect),
        MODEL,
        tokenizer,
        gateway_format("gemma-turns", tokenizer, MODEL),
        engine.context_tokens,
    )


class Replies:
    """A script: the answers given, in order, then a short good reply to every request after."""

    def __init__(self, dialect: str, tokenizer: GatewayTokenizer, *answers: Answer) -> None:
        self.dialect = dialect
        self.answers = list(answers)
        self.fine = reply(dialect, [("fine", tokenizer.tokenize_text("fine"))])

    def __call__(self, path: str, body: dict[str, Any]) -> Answer:
        return self.answers.pop(0) if self.answers else self.fine


@contextlib.asynccontextmanager
async def serving(
    dialect: str, tokenizer: GatewayTokenizer, *answers: Answer, context_tokens: int = 8192
) -> AsyncIterator[tuple[MisbehavingEngine, str]]:
    """The misbehaving engine and a real wschat in front of it; yields both (wschat's URL)."""
    script = Replies(dialect, tokenizer, *answers)
    async with misbehaving_engine(dialect, script, context_tokens=context_tokens) as engine:
        remote = gateway(engine, tokenizer)
        try:
            async with running_server(remote) as url:
                yield engine, url
        finally:
            await remote.aclose()


async def prompt(peer: RawPeer, frame_id: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": "Hello", "params": params})
    return await peer.recv_until("done")


async def failed_then_goes_on(peer: RawPeer) -> list[dict[str, Any]]:
    """The first prompt's frames, checked to end ``internal`` then ``done(error)``; the next
    prompt's reply is whole."""
    frames = await prompt(peer, "a")
    assert [f["type"] for f in frames[-2:]] == ["error", "done"], frames[-2:]
    assert frames[-2]["code"] == "internal" and frames[-1]["reason"] == "error"
    after = (await prompt(peer, "b"))[-1]
    assert (after["reason"], after["text"]) == ("stop", "fine")
    return frames


async def largest_metric(url: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        return max(samples((await http.get(http_base(url) + "/metrics")).text).values())


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("limit", "params", "context_tokens"),
    [("max_new_tokens", {"max_new_tokens": 5}, 8192), ("context", {}, 64)],
)
async def test_tokens_past_the_limit_are_not_taken_and_the_stream_is_closed(
    tokenizer: GatewayTokenizer,
    dialect: str,
    limit: str,
    params: dict[str, Any],
    context_tokens: int,
) -> None:
    # an engine that ignores max_tokens (n_predict) and streams for ever
    (word,) = tokenizer.tokenize_text(" a")
    answer = endless(dialect, " a", word)
    async with (
        serving(dialect, tokenizer, answer, context_tokens=context_tokens) as (engine, url),
        raw_peer(url) as (peer, _),
    ):
        done = (await prompt(peer, "a", **params))[-1]
        served = await engine.served[0].end()
        await peer.send({"type": "reset"})  # a reply to the context's end leaves it full
        await peer.recv_until("reset_ok")
        after = (await prompt(peer, "b"))[-1]
    usage = done["usage"]
    expected = 5 if limit == "max_new_tokens" else context_tokens - usage["prompt_tokens"]
    assert done["reason"] == "length" and usage["completion_tokens"] == expected
    assert done["text"] == " a" * expected
    assert served.closed_early, served.sent
    assert (after["reason"], after["text"]) == ("stop", "fine")


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_chunk_of_more_ids_than_the_limit_leaves_is_cut_at_the_limit(
    tokenizer: GatewayTokenizer, dialect: str
) -> None:
    ids = tokenizer.tokenize_text(" one two three four five six")
    answer = Answer([token(dialect, " one two three four five six", ids), last(dialect)])
    async with serving(dialect, tokenizer, answer) as (_, url), raw_peer(url) as (peer, _):
        done = (await prompt(peer, "a", max_new_tokens=3))[-1]
    assert done["reason"] == "length" and done["text"].strip() == "one two three"
    assert done["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "bad",
    [
        "cached 10**30",
        "cached 1e30",
        "cached -1",
        "cached '12'",
        "id 2**64",
        "id 2**63",
        "id -1",
        "id past the vocabulary",
        "id 1.5",
        "text a map",
        "ids a string",
    ],
)
async def test_a_value_out_of_range_or_of_the_wrong_type_is_internal_then_done(
    tokenizer: GatewayTokenizer, dialect: str, bad: str
) -> None:
    word = tokenizer.tokenize_text(" a")
    what, value = bad.split(" ", 1)
    wrongs: dict[str, Any] = {
        "10**30": 10**30,
        "1e30": 1e30,
        "-1": -1,
        "'12'": "12",
        "2**64": 2**64,
        "2**63": 2**63,
        "past the vocabulary": 10**9,
        "1.5": 1.5,
        "a map": {"text": "a"},
        "a string": "abc",
    }
    wrong = wrongs[value]
    if what == "cached":
        answer = reply(dialect, [(" a", word)], cached=wrong)
    elif what == "id":
        answer = reply(dialect, [(" a", [wrong])])
    elif what == "text":
        answer = Answer([token(dialect, wrong, word), last(dialect)])
    else:
        answer = Answer([token(dialect, " a", wrong), last(dialect)])
    async with serving(dialect, tokenizer, answer) as (_, url), raw_peer(url) as (peer, _):
        await failed_then_goes_on(peer)
        assert await largest_metric(url) < 1e12


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("size", ["a 100 MB line", "a 50 MB chunk", "a 1 MB chunk's text"])
async def test_a_line_or_a_chunks_text_over_its_limit_is_internal_and_the_stream_closed(
    tokenizer: GatewayTokenizer, dialect: str, size: str
) -> None:
    word = tokenizer.tokenize_text(" a")
    if size == "a 100 MB line":
        body: Any = [b"data: ", *megabytes(100 << 20)]
    elif size == "a 50 MB chunk":
        body = [token(dialect, "x" * (50 << 20), word)]
    else:
        body = [token(dialect, "x" * (1 << 20), word), last(dialect)]
    async with serving(dialect, tokenizer, Answer(body)) as (engine, url):
        async with raw_peer(url) as (peer, _):
            frames = await failed_then_goes_on(peer)
        served = await engine.served[0].end()
    assert all(len(f["text"]) <= CHUNK_TEXT_BYTES for f in frames if f["type"] == "token")
    if size != "a 1 MB chunk's text":  # that one is within the line limit: sent whole
        assert served.closed_early and served.sent < WRITTEN_AT_MOST, served.sent


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_error_body_is_read_only_so_far_and_the_connection_closed(
    tokenizer: GatewayTokenizer, dialect: str
) -> None:
    message = b'{"error": {"message": "out of memory' + b"!" * 100
    answer = Answer([message, *megabytes(200 << 20, b" ")], status=500, headers={})
    async with serving(dialect, tokenizer, answer) as (engine, url):
        async with raw_peer(url) as (peer, _):
            await failed_then_goes_on(peer)
        served = await engine.served[0].end()
    assert served.closed_early and served.sent < WRITTEN_AT_MOST, served.sent
    assert ERROR_BODY_BYTES < WRITTEN_AT_MOST


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_compressed_reply_is_refused_as_internal(
    tokenizer: GatewayTokenizer, dialect: str
) -> None:
    # a few bytes may unpack into many: we ask for no compression, and take none
    fine = Replies(dialect, tokenizer).fine
    headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
    answer = Answer([gzip.compress(b"".join(fine.body))], headers=headers)
    async with serving(dialect, tokenizer, answer) as (_, url), raw_peer(url) as (peer, _):
        await failed_then_goes_on(peer)

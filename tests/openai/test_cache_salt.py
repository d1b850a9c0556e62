"""The gateway salts a vLLM engine's prefix cache per owner: every request it sends carries
``cache_salt``, its owner's scope (``web/access.owner_scope``: the digest of its token, the
first offered that is one of the server's; never the token), so ``cached_tokens`` tells no
client what another one sent. Without tokens no salt is sent (every client one owner), nor to
an engine that reads none (llama.cpp). The engine is the fake of
``tests/fakes/openai_engine.py``, which keeps each body it is sent."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai.dialect import LLAMA_CPP, VLLM
from wschat.server.engine.openai.tokenizer import (
    GatewayTokenizer,
    load_tokenizer,
)

from tests.api.support import async_client, user
from tests.fakes.openai_engine import Answer, MisbehavingEngine, misbehaving_engine, reply
from tests.openai.connected import connected
from tests.support import raw_peer, running_server

TOKENS = ("alice-token", "bob-token")


@pytest.fixture(scope="module")
def tokenizer() -> GatewayTokenizer:
    return load_tokenizer("embedded", default_cache_dir())


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@contextlib.asynccontextmanager
async def gateway(
    tokenizer: GatewayTokenizer, dialect: str, tokens: tuple[str, ...] = ()
) -> AsyncIterator[tuple[MisbehavingEngine, str]]:
    """The fake engine speaking ``dialect``, each prompt answered "Paris.", and a server
    (``tokens`` its tokens) whose openai engine is connected to it as the CLI does."""
    ids = tokenizer.tokenize_text("Paris.")

    def script(path: str, body: dict[str, Any]) -> Answer:
        return reply(dialect, [("Paris", ids[:1]), (".", ids[1:])])

    async with (
        misbehaving_engine(dialect, script) as engine,
        connected(engine, dialect) as remote,
        running_server(remote, tokens=tokens) as url,
    ):
        yield engine, url


async def prompt_as(url: str, token: str | None, system: str | None = None) -> None:
    """A new session's prompt, with ``token`` offered where one is given."""
    async with raw_peer(f"{url}?token={token}" if token else url) as (peer, _):
        if system is not None:
            await peer.send({"type": "configure", "system": system})
            await peer.recv_until("configured")
        await peer.send({"type": "prompt", "id": "p", "text": "Hello", "params": {}})
        done = (await peer.recv_until("done"))[-1]
    assert done["reason"] == "stop", done


def salts(engine: MisbehavingEngine) -> list[str | None]:
    return [served.body.get("cache_salt") for served in engine.served]


async def test_each_owners_requests_to_vllm_carry_its_digest_as_cache_salt(
    tokenizer: GatewayTokenizer,
) -> None:
    alice, bob = TOKENS
    async with gateway(tokenizer, VLLM, TOKENS) as (engine, url):
        await prompt_as(url, alice)
        await prompt_as(url, bob)
        await prompt_as(url, alice, system="Be brief.")
    assert salts(engine) == [digest(alice), digest(bob), digest(alice)]
    assert digest(alice) != digest(bob)
    for served in engine.served:
        sent = json.dumps(served.body)
        assert alice not in sent and bob not in sent


async def test_without_tokens_no_cache_salt_is_sent(tokenizer: GatewayTokenizer) -> None:
    async with gateway(tokenizer, VLLM) as (engine, url):
        await prompt_as(url, None)
        await prompt_as(url, None, system="Be brief.")
    assert [("cache_salt" in served.body) for served in engine.served] == [False, False]


async def test_the_salt_is_the_token_a_client_was_let_in_with_not_one_it_made_up(
    tokenizer: GatewayTokenizer,
) -> None:
    """A client that offers a made-up token before its own is the owner of its own token: one
    token holder cannot name owners at will."""
    alice = TOKENS[0]
    async with gateway(tokenizer, VLLM, TOKENS) as (engine, url):
        await prompt_as(url, f"made-up&token={alice}")
    async with gateway(tokenizer, VLLM) as (untokened, url):
        await prompt_as(url, "made-up")  # no tokens set: every client one owner
    assert salts(engine) == [digest(alice)]
    assert "cache_salt" not in untokened.served[0].body


async def test_llama_cpp_is_sent_no_cache_salt(tokenizer: GatewayTokenizer) -> None:
    async with gateway(tokenizer, LLAMA_CPP, TOKENS) as (engine, url):
        await prompt_as(url, TOKENS[0])
    assert [served.path for served in engine.served] == ["/completion"]
    assert "cache_salt" not in engine.served[0].body


async def test_api_requests_to_vllm_carry_their_api_keys_digest_as_cache_salt(
    tokenizer: GatewayTokenizer,
) -> None:
    async with gateway(tokenizer, VLLM, TOKENS) as (engine, url):
        for token in TOKENS:
            async with async_client(url, token) as client:
                answer = await client.chat.completions.create(
                    model="any", messages=[user("Hello")], max_tokens=8
                )
            assert answer.choices[0].message.content == "Paris."
    assert salts(engine) == [digest(token) for token in TOKENS]

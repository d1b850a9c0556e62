"""KV reuse across turns, for both engines, on the tiny random Gemma 3 in float32: a session's
later prompts prefill only their new tokens and give exactly what a full prefill gives; a
cancelled reply stays in the history and the cache; ``reset`` drops both; the KV budget evicts
the least recently used idle sessions."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from wschat.server.conversation import Conversation
from wschat.server.engine.base import Finished, Generation, GenerationRequest, SamplingParams
from wschat.server.engine.batched import BatchedEngine
from wschat.server.engine.hf import HFEngine
from wschat.server.loader import LoadedModel

from tests.engine.test_formats import GEMMA_TEMPLATE
from tests.support import RawPeer, collect, raw_peer, running_server

Engine = HFEngine | BatchedEngine


@pytest.fixture(params=["generate", "batched"])
async def engine(
    request: pytest.FixtureRequest, tiny_text_loaded: LoadedModel
) -> AsyncIterator[Engine]:
    made: Engine = (
        HFEngine(tiny_text_loaded)
        if request.param == "generate"
        else BatchedEngine(tiny_text_loaded, prefill_tokens=32)
    )
    yield made
    await made.aclose()


async def run(engine: Engine, ids: list[int], key: str | None, tokens: int = 10) -> Finished:
    return (await run_text(engine, ids, key, tokens))[1]


async def run_text(
    engine: Engine, ids: list[int], key: str | None, tokens: int = 10
) -> tuple[str, Finished]:
    generation: Generation = engine.start(
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


async def test_greedy_turns_with_reuse_equal_turns_prefilled_in_full(engine: Engine) -> None:
    history = [2]
    for turn, text in enumerate(["Hello there", "Tell me more", "And after that?", "Why"]):
        history += user_turn(engine, text)
        reused = await run(engine, history, "s")
        full = await run(engine, history, None)
        assert reused.completion_ids == full.completion_ids
        assert (reused.cached_tokens > 0) == (turn > 0)
        assert full.cached_tokens == 0
        history += [*reused.completion_ids, 106]


def with_template(loaded: LoadedModel, template: str) -> LoadedModel:
    tokenizer = copy.deepcopy(loaded.tokenizer)
    tokenizer.chat_template = template
    return dataclasses.replace(loaded, tokenizer=tokenizer)


@pytest.mark.parametrize("prompt_format", ["gemma-turns", "transcript", "chat-template"])
@pytest.mark.parametrize("kind", ["generate", "batched"])
async def test_greedy_turns_with_reuse_equal_full_prefills_in_every_prompt_format(
    tiny_text_loaded: LoadedModel, kind: str, prompt_format: str
) -> None:
    loaded = with_template(tiny_text_loaded, GEMMA_TEMPLATE)
    engine: Engine = (
        HFEngine(loaded, prompt_format=prompt_format)
        if kind == "generate"
        else BatchedEngine(loaded, prefill_tokens=32, prompt_format=prompt_format)
    )
    try:
        assert engine.info.prompt_format == prompt_format
        conversation = Conversation(engine.prompt_format)
        conversation.set_system("Answer briefly.")
        for turn, text in enumerate(["Hello there", "Tell me more", "And after that?"]):
            user = conversation.tokenize_user(text)
            prompt = conversation.prompt_ids(user)
            reused = await run(engine, prompt, "s")
            full = await run(engine, prompt, None)
            assert reused.completion_ids == full.completion_ids
            assert (reused.cached_tokens > 0) == (turn > 0)
            conversation.add_exchange(user, [], [], reused.completion_ids)
    finally:
        await engine.aclose()


def sessions_cached(engine: Engine) -> set[str]:
    store = engine.kv
    return set(store._entries)


async def test_kv_budget_evicts_the_least_recently_used_idle_session(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_text_loaded, kv_budget_tokens=0)
    prompt = [2, *user_turn(engine, "hi")]
    engine.kv.budget_tokens = 2 * (len(prompt) + 10 - 1)  # two sessions' caches fit, not three
    try:
        for key in ("a", "b"):
            await run(engine, prompt, key)
        assert sessions_cached(engine) == {"a", "b"}
        await run(engine, prompt, "c")
        assert sessions_cached(engine) == {"b", "c"}  # "a" was idle the longest
        finished = await run(engine, prompt, "a")
        assert finished.cached_tokens == 0  # it re-prefills
        assert engine.kv.evictions == 2  # "a" made room by evicting "b"
        assert sessions_cached(engine) == {"c", "a"}
    finally:
        await engine.aclose()


async def ask(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


async def test_second_turn_over_a_server_is_cached_and_matches_a_fresh_session(
    engine: Engine,
) -> None:
    requests: list[GenerationRequest] = []
    original_start = engine.start

    def start_and_keep(request: GenerationRequest) -> Generation:
        requests.append(request)
        return original_start(request)

    engine.start = start_and_keep  # type: ignore[method-assign]
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        first = await ask(peer, "a", "One", max_new_tokens=8)
        second = await ask(peer, "b", "Two", max_new_tokens=8)
    assert first[0]["cached_tokens"] == 0
    assert second[0]["cached_tokens"] == first[0]["prompt_tokens"] + 8 - 1
    assert second[-1]["usage"]["cached_tokens"] == second[0]["cached_tokens"]
    fresh, _ = await run_text(engine, requests[1].prompt_ids, None, tokens=8)  # all of it
    assert fresh == second[-1]["text"]


async def test_cancelled_reply_stays_in_history_and_cache_and_reset_drops_both(
    engine: Engine,
) -> None:
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(
            {"type": "prompt", "id": "a", "text": "Go", "params": {"max_new_tokens": 400}}
        )
        await peer.recv_until("token")
        await peer.send({"type": "cancel", "id": "a"})
        cancelled = (await peer.recv_until("done"))[-1]
        assert cancelled["reason"] == "cancelled"
        whole = cancelled["usage"]["prompt_tokens"] + cancelled["usage"]["completion_tokens"]
        after_cancel = await ask(peer, "b", "Next", max_new_tokens=4)
        # The cached prefix covers the cancelled reply, so it is in the conversation as generated;
        # its last token is cached too when the step that picked its successor fed it.
        assert whole - 1 <= after_cancel[0]["cached_tokens"] <= whole
        await peer.send({"type": "reset", "id": "r"})
        await peer.recv_until("reset_ok")
        after_reset = await ask(peer, "c", "Next", max_new_tokens=4)
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        fresh = await ask(peer, "a", "Next", max_new_tokens=4)
    assert after_reset[0]["cached_tokens"] == 0
    assert after_reset[0]["prompt_tokens"] == fresh[0]["prompt_tokens"]
    assert after_reset[-1]["text"] == fresh[-1]["text"]

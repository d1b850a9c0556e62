"""KV reuse across turns, for both engines, on the tiny random Gemma 3 in float32: a session's
later prompts prefill only their new tokens and give exactly what a full prefill gives; a
cancelled reply stays in the history and the cache; ``reset`` drops both; the KV budget evicts
the least recently used idle sessions."""

from __future__ import annotations

import copy
import dataclasses

import PIL.Image
import pytest
import torch
from wschat.server.engine.base import Generation, GenerationRequest, SamplingParams
from wschat.server.engine.history import Conversation
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions
from wschat.server.engine.local.precision import pick_precision

from tests.engine.local_turns import (
    Engine,
    ask,
    engine_fixture,
    kv_bytes,
    make_engine,
    run,
    run_text,
    sessions_cached,
    user_turn,
)
from tests.engine.test_formats import GEMMA_TEMPLATE
from tests.support import collect, next_stats, raw_peer, running_server, stats_socket

engine = engine_fixture("tiny_text_loaded")


async def test_greedy_turns_with_reuse_equal_turns_prefilled_in_full(engine: Engine) -> None:
    await turns_with_reuse_equal_full_prefills(engine)


@pytest.mark.parametrize("kind", ["generate", "batched"])
async def test_greedy_turns_with_reuse_equal_full_prefills_with_packed_weights(
    tiny_text_packed: LoadedModel, kind: str
) -> None:
    if tiny_text_packed.dtype != torch.float32:
        # bf16 rounds a prompt's sums otherwise when it is split into a cached prefix and a
        # tail (plain bf16 as much as packed): only float32 arithmetic gives equal tokens
        pytest.skip(f"{tiny_text_packed.precision_name} computes in bf16")
    if pick_precision(tiny_text_packed.precision_name, "cpu").int8_blocks:
        # a reused prefix's tail of a token or two reads the int8 copies, a full prefill not
        pytest.skip(f"{tiny_text_packed.precision_name} multiplies narrow steps in int8")
    engine = make_engine(tiny_text_packed, kind)
    try:
        await turns_with_reuse_equal_full_prefills(engine)
    finally:
        await engine.aclose()


async def turns_with_reuse_equal_full_prefills(engine: Engine) -> None:
    history = [2]
    for turn, text in enumerate(["Hello there", "Tell me more", "And after that?", "Why"]):
        history += user_turn(engine, text)
        reused = await run(engine, history, "s")
        full = await run(engine, history, None)
        assert reused.completion_ids == full.completion_ids
        assert (reused.usage.cached_tokens > 0) == (turn > 0)
        assert full.usage.cached_tokens == 0
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
    engine = make_engine(loaded, kind, prompt_format=prompt_format)
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
            assert (reused.usage.cached_tokens > 0) == (turn > 0)
            conversation.add_exchange(user, [], [], reused.completion_ids)
    finally:
        await engine.aclose()


@pytest.mark.parametrize("positions", [12, 40])  # within and past the sliding window (16)
async def test_kv_store_counts_the_bytes_of_the_layers_heads_and_dtype(
    engine: Engine, tiny_text_loaded: LoadedModel, positions: int
) -> None:
    prompt = [2, *engine.tokenize_text("hello world " * 20)][: positions - 10 + 1]
    finished = await run(engine, prompt, "s")
    assert finished.usage.cached_tokens == 0
    assert engine.kv.tokens == positions  # the prompt and the replies' tokens but the last
    assert engine.kv.bytes == kv_bytes(tiny_text_loaded, positions)


async def test_kv_budget_in_bytes_evicts_the_least_recently_used_idle_session(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_text_loaded)
    prompt = [2, *user_turn(engine, "hi")]
    one_session = kv_bytes(tiny_text_loaded, len(prompt) + 10 - 1)
    engine.kv.budget_bytes = 2 * one_session + one_session // 2  # two sessions fit, not three
    try:
        for key in ("a", "b"):
            await run(engine, prompt, key)
        assert sessions_cached(engine) == {"a", "b"}
        await run(engine, prompt, "c")
        assert sessions_cached(engine) == {"b", "c"}  # "a" was idle the longest
        finished = await run(engine, prompt, "a")
        assert finished.usage.cached_tokens == 0  # it re-prefills
        assert engine.kv.evictions == 2  # "a" made room by evicting "b"
        assert sessions_cached(engine) == {"c", "a"}
        assert engine.kv.bytes == 2 * one_session <= engine.kv.budget_bytes
    finally:
        await engine.aclose()


async def test_a_session_bigger_than_the_whole_budget_is_not_kept(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = HFEngine(
        tiny_text_loaded, LocalEngineOptions(kv_budget_bytes=kv_bytes(tiny_text_loaded, 4))
    )
    try:
        await run(engine, [2, *user_turn(engine, "hi")], "a")
        assert sessions_cached(engine) == set() and engine.kv.bytes == 0
    finally:
        await engine.aclose()


async def test_the_batch_and_the_image_path_share_one_kv_budget(
    tiny_vision_loaded: LoadedModel,
) -> None:
    """Text-only turns run in the batch, turns with images in generate (batched.py); both keep
    their sessions' KV state in one store, under one budget, and a session moving from one to
    the other leaves no state of the first behind."""
    engine = BatchedEngine(tiny_vision_loaded)
    try:
        text_only = Conversation(engine.prompt_format).prompt_ids(engine.tokenize_text("hi"))
        await run(engine, text_only, "text")
        image = engine.prepare_image(PIL.Image.new("RGB", (48, 32), (255, 0, 0)))
        with_image = Conversation(engine.prompt_format).prompt_ids(
            engine.tokenize_text("look"), [engine.image_placeholder_ids()]
        )
        request = GenerationRequest(
            with_image, SamplingParams(max_new_tokens=10), [image], session_key="image"
        )
        await collect(engine.generate(request))
        assert sessions_cached(engine) == {"text", "image"}
        held = kv_bytes(tiny_vision_loaded, len(text_only) + 9)
        held += kv_bytes(tiny_vision_loaded, len(with_image) + 9)
        assert engine.kv.bytes == held
        # The text session sends an image: generate cannot read the batch's form of its state,
        # which is dropped (not left to wait for eviction), and it prefills in full.
        history = [*text_only, *engine.tokenize_text(" more"), *engine.image_placeholder_ids()]
        request = GenerationRequest(
            history, SamplingParams(max_new_tokens=10), [image], session_key="text"
        )
        _, finished = await collect(engine.generate(request))
        assert finished.error is None and finished.usage.cached_tokens == 0
        held += kv_bytes(tiny_vision_loaded, len(history) + 9)
        held -= kv_bytes(tiny_vision_loaded, len(text_only) + 9)
        assert engine.kv.bytes == held
    finally:
        await engine.aclose()


async def test_second_turn_over_a_server_is_cached_and_matches_a_fresh_session(
    engine: Engine,
) -> None:
    requests: list[GenerationRequest] = []
    original_generate = engine.generate

    def generate_and_keep(request: GenerationRequest) -> Generation:
        requests.append(request)
        return original_generate(request)

    engine.generate = generate_and_keep  # type: ignore[method-assign]
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


async def test_stats_report_the_kv_bytes_held_and_the_budget(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(kv_budget_bytes=3 << 20))
    try:
        async with running_server(engine) as url, stats_socket(url) as ws:
            first = await next_stats(ws)
            assert (first.kv_tokens, first.kv_bytes, first.kv_budget_bytes) == (0, 0, 3 << 20)
            async with raw_peer(url) as (peer, _):
                await ask(peer, "a", "One", max_new_tokens=8)
            while not (stats := await next_stats(ws)).kv_tokens:
                pass
    finally:
        await engine.aclose()
    assert stats.kv_bytes == kv_bytes(tiny_text_loaded, stats.kv_tokens) == engine.kv.bytes
    assert stats.kv_budget_bytes == 3 << 20

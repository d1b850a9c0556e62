"""KV reuse across turns, for both engines, on the tiny random Gemma 3 in float32: a session's
later prompts prefill only their new tokens and give exactly what a full prefill gives; a
cancelled reply stays in the history and the cache; ``reset`` drops both; the KV budget evicts
the least recently used idle sessions."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import PIL.Image
import pytest
import torch
from wschat.server.engine.base import Finished, Generation, GenerationRequest, SamplingParams
from wschat.server.engine.history import Conversation
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel, load_model

from tests.engine.test_formats import GEMMA_TEMPLATE
from tests.support import RawPeer, collect, next_stats, raw_peer, running_server, stats_socket

Engine = HFEngine | BatchedEngine


def make_engine(loaded: LoadedModel, kind: str, **options: Any) -> Engine:
    """The ``generate`` or the batched engine over ``loaded`` (prefills in chunks of 32)."""
    if kind == "generate":
        return HFEngine(loaded, **options)
    return BatchedEngine(loaded, prefill_tokens=32, **options)


@pytest.fixture(params=["generate", "batched"])
async def engine(
    request: pytest.FixtureRequest, tiny_text_loaded: LoadedModel
) -> AsyncIterator[Engine]:
    made = make_engine(tiny_text_loaded, request.param)
    yield made
    await made.aclose()


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
    engine = HFEngine(tiny_text_loaded, kv_budget_bytes=kv_bytes(tiny_text_loaded, 4))
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
        assert engine.single.kv is engine.kv
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


async def ask(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


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
    engine = BatchedEngine(tiny_text_loaded, kv_budget_bytes=3 << 20)
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


# -- a prompt that shares only a prefix with the cache (a rewind, a regenerate, an edit) ------

WINDOW = 16  # the tiny model's sliding window


def words(engine: Engine, count: int, text: str = "the cat sat on a mat and ") -> list[int]:
    ids = engine.tokenize_text(text * count)[:count]
    assert len(ids) == count
    return ids


async def reply_then_fresh(
    engine: Engine, first: list[int], second: list[int]
) -> tuple[Finished, Finished, Finished]:
    """The session's reply to ``first``, then its reply to ``second`` on what it cached, then
    ``second`` answered with nothing cached."""
    replied = await run(engine, first, "s")
    reused = await run(engine, second, "s")
    fresh = await run(engine, second, None)
    assert fresh.usage.cached_tokens == 0
    assert reused.usage.prompt_tokens == fresh.usage.prompt_tokens == len(second)
    assert reused.completion_ids == fresh.completion_ids
    return replied, reused, fresh


def diverging(engine: Engine, ids: list[int], at: int) -> list[int]:
    """``ids[:at]``, then other tokens: the first differs from ``ids[at]``."""
    other = engine.tokenize_text(" zebra quartz violin")
    assert other[0] != ids[at]
    return [*ids[:at], *other]


async def test_a_prompt_diverging_from_the_cache_within_the_window_reuses_the_shared_prefix(
    engine: Engine, tiny_text_loaded: LoadedModel
) -> None:
    first = [2, *words(engine, 5)]
    replied = await run(engine, first, "s")  # caches 6 + 10 - 1 = 15 tokens: below the window
    cached = [*first, *replied.completion_ids][: len(first) + 9]
    assert len(cached) < WINDOW
    second = diverging(engine, cached, 8)
    reused = await run(engine, second, "s")
    fresh = await run(engine, second, None)
    assert reused.completion_ids == fresh.completion_ids
    assert reused.usage.cached_tokens == 8
    # what the cut cache held beyond the prefix is gone from the store's bytes; the sliding
    # layers of the 8 positions the reply started from stay, as its ring mark
    mark = kv_bytes(tiny_text_loaded, 8, full=False)
    assert engine.kv.bytes == kv_bytes(tiny_text_loaded, len(second) + 10 - 1) + mark


async def test_the_cached_prompt_sent_again_reuses_all_of_it_but_its_last_token(
    engine: Engine,
) -> None:
    first = [2, *words(engine, 5)]  # a regenerate: the prompt again, its reply cached after it
    _, reused, _ = await reply_then_fresh(engine, first, first)
    assert reused.usage.cached_tokens == len(first) - 1


async def test_a_prompt_diverging_from_the_cache_past_the_window_is_prefilled_in_full(
    engine: Engine,
) -> None:
    """The sliding layers no longer hold the positions before the divergence that its first
    token reads, and recomputing them needs the layers below over a window more each: the
    whole prompt is prefilled."""
    first = [2, *words(engine, 29)]  # caches 30 + 10 - 1 tokens
    _, reused, _ = await reply_then_fresh(engine, first, diverging(engine, first, 20))
    assert reused.usage.cached_tokens == 0
    _, regenerated, _ = await reply_then_fresh(engine, first, first)
    assert regenerated.usage.cached_tokens == 0


async def test_diverging_at_the_last_cached_token_past_the_window_reuses_the_rest_in_the_batch(
    engine: Engine,
) -> None:
    """The batch's ring keeps ``window`` positions, one more than the next token reads, so a
    cache cut by one token still holds them; ``generate``'s sliding layers keep ``window - 1``:
    cut by one, they lack the oldest."""
    first = [2, *words(engine, 19)]
    replied = await run(engine, first, "s")
    cached = [*first, *replied.completion_ids][: len(first) + 9]
    second = diverging(engine, cached, len(cached) - 1)
    reused = await run(engine, second, "s")
    fresh = await run(engine, second, None)
    assert reused.completion_ids == fresh.completion_ids
    assert reused.usage.cached_tokens == (len(cached) - 1 if engine.name == "batched" else 0)


async def conversation_past_the_window(engine: Engine, texts: list[str]) -> list[list[int]]:
    """A session's greedy turns, each prompt the last one, its reply and a user turn; the
    prompts, with ``boundaries[k]`` (the tokens cached when turn k + 1 starts) after them."""
    prompts: list[list[int]] = []
    history = [2]
    for text in texts:
        history = [*history, *user_turn(engine, text)]
        prompts.append(history)
        replied = await run(engine, history, "s")
        history = [*history, *replied.completion_ids]
    assert len(prompts[1]) > WINDOW  # every turn but the first starts past the window
    return prompts


async def reply_reusing(engine: Engine, prompt: list[int], boundary: int) -> Finished:
    """The session's reply to ``prompt``: equal to a fresh run's, with ``boundary`` cached."""
    reused = await run(engine, prompt, "s")
    fresh = await run(engine, prompt, None)
    assert reused.completion_ids == fresh.completion_ids
    assert reused.usage.prompt_tokens == fresh.usage.prompt_tokens == len(prompt)
    assert reused.usage.cached_tokens == boundary
    return reused


TURNS = ["Hello there", "Tell me more", "And after that?", "Why"]


async def test_an_edit_past_the_window_reuses_the_ring_marked_at_its_turn_boundary(
    engine: Engine,
) -> None:
    """Editing turn 3 of 4: the sliding layers' ring of today no longer holds what comes
    before turn 3, but the ring as it was when turn 3 started is kept (a mark): everything
    before turn 3's message is reused, and only the rest is prefilled."""
    prompts = await conversation_past_the_window(engine, TURNS)
    # turn 3 started from the cache of turn 2's prompt and reply (its last token unfed)
    boundary = len(prompts[2]) - len(user_turn(engine, TURNS[2])) - 1
    edited = [*prompts[2][: boundary + 1], *user_turn(engine, "Something else entirely")]
    await reply_reusing(engine, edited, boundary)
    # the edited turn regenerated: its own mark, at the same boundary, was carried along
    await reply_reusing(engine, edited, boundary)


async def test_a_regenerate_past_the_window_reuses_the_previous_exchange(engine: Engine) -> None:
    prompts = await conversation_past_the_window(engine, TURNS)
    boundary = len(prompts[3]) - len(user_turn(engine, TURNS[3])) - 1
    await reply_reusing(engine, prompts[3], boundary)
    # a rewind to turn 2 then its own message again: the mark of turn 2's start
    earlier = len(prompts[1]) - len(user_turn(engine, TURNS[1])) - 1
    await reply_reusing(engine, prompts[1], earlier)


async def test_a_cut_before_a_turn_that_started_within_the_window_reuses_up_to_the_cut(
    engine: Engine,
) -> None:
    """The ring a turn started from within the window holds every position before it, so a
    cut anywhere before that start reuses all of the prefix, not only whole turns."""
    first = [2, *words(engine, 5)]
    replied = await run(engine, first, "s", tokens=4)
    second = [*first, *replied.completion_ids, *words(engine, 3)]
    start = len(first) + len(replied.completion_ids) - 1  # what turn 2 started from
    assert start < WINDOW < len(second) + 10 - 1  # it ends past the window
    await run(engine, second, "s")
    await reply_reusing(engine, diverging(engine, second, 7), 7)


async def test_the_stores_bytes_count_the_ring_marks_a_session_keeps(
    engine: Engine, tiny_text_loaded: LoadedModel
) -> None:
    prompts = await conversation_past_the_window(engine, TURNS[:2])
    boundary = len(prompts[1]) - len(user_turn(engine, TURNS[1])) - 1
    (entry,) = engine.kv.sessions().values()
    assert [m.length for m in entry.marks] == [boundary]  # the ring as turn 2 started
    mark = kv_bytes(tiny_text_loaded, boundary, full=False)
    assert engine.kv.bytes == kv_bytes(tiny_text_loaded, len(entry.ids)) + mark


def load_widened(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A copy of the tiny model in ``model_dir`` whose sliding window (512) is wider than the
    prompts of a test, loaded in float32."""
    target = tmp_path_factory.mktemp("wide-window") / "model"
    shutil.copytree(model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config.get("text_config", config)["sliding_window"] = 512
    (target / "config.json").write_text(json.dumps(config))
    return load_model(str(target), dtype="float32")


@pytest.fixture(scope="module")
def wide_vision_loaded(
    tiny_vision_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> LoadedModel:
    """The tiny vision model with a sliding window wider than the prompts here: its own (16)
    is no wider than an image's soft tokens, so no cache of an image could be cut back."""
    return load_widened(tiny_vision_dir, tmp_path_factory)


@pytest.fixture(params=["generate", "batched"])
async def wide_vision_engine(
    request: pytest.FixtureRequest, wide_vision_loaded: LoadedModel
) -> AsyncIterator[Engine]:
    made = make_engine(wide_vision_loaded, request.param)
    yield made
    await made.aclose()


def picture(engine: Engine, color: tuple[int, int, int]) -> Any:
    return engine.prepare_image(PIL.Image.new("RGB", (48, 32), color))


async def answer(
    engine: Engine, prompt: list[int], images: list[Any], new: int, key: str | None
) -> Finished:
    request = GenerationRequest(
        prompt, SamplingParams(max_new_tokens=10), images, session_key=key, new_images=new
    )
    _, finished = await collect(engine.generate(request))
    assert finished.error is None
    return finished


async def test_a_turn_edited_with_another_image_reuses_only_what_comes_before_its_image(
    wide_vision_engine: Engine,
) -> None:
    """Every image takes the same placeholder ids: the cache of the first image is not the
    second's, however many ids they share."""
    engine = wide_vision_engine
    run_ids = engine.image_placeholder_ids()
    prompt = Conversation(engine.prompt_format).prompt_ids(engine.tokenize_text("look"), [run_ids])
    red, blue = picture(engine, (255, 0, 0)), picture(engine, (0, 0, 255))
    with_red = await answer(engine, prompt, [red], 1, "s")
    edited = await answer(engine, prompt, [blue], 1, "s")
    fresh = await answer(engine, prompt, [blue], 1, None)
    assert edited.completion_ids == fresh.completion_ids != with_red.completion_ids
    before_image = next(i for i in range(len(prompt)) if prompt[i : i + len(run_ids)] == run_ids)
    assert edited.usage.cached_tokens == before_image


async def test_an_edited_text_turn_after_an_image_reuses_the_image_and_the_shared_text(
    wide_vision_engine: Engine,
) -> None:
    engine = wide_vision_engine
    conversation = Conversation(engine.prompt_format)
    red = picture(engine, (255, 0, 0))
    first = conversation.prompt_ids(engine.tokenize_text("look"), [engine.image_placeholder_ids()])
    replied = await answer(engine, first, [red], 1, "s")
    runs = [engine.image_placeholder_ids()]
    conversation.add_exchange(engine.tokenize_text("look"), runs, [red], replied.completion_ids)
    asked = conversation.prompt_ids(engine.tokenize_text("what is the colour of it"))
    await answer(engine, asked, [red], 0, "s")
    edited = conversation.prompt_ids(engine.tokenize_text("what is the shape of it"))
    reused = await answer(engine, edited, [red], 0, "s")
    fresh = await answer(engine, edited, [red], 0, None)
    assert reused.completion_ids == fresh.completion_ids
    shared = next(i for i, (a, b) in enumerate(zip(asked, edited, strict=False)) if a != b)
    assert len(first) < shared
    assert reused.usage.cached_tokens == shared


async def regenerate(peer: RawPeer, frame_id: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "regenerate", "id": frame_id, "params": params})
    return await peer.recv_until("done")


@pytest.mark.parametrize("tokens", [4, 12])  # the cache within the window (16), and past it
async def test_a_regenerate_with_the_same_seed_repeats_the_reply_and_another_seed_does_not(
    engine: Engine, tokens: int
) -> None:
    sampled = {"max_new_tokens": tokens, "temperature": 1.5, "top_k": 0, "top_p": 1.0}
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        first = await ask(peer, "a", "Go", seed=7, **sampled)
        again = await regenerate(peer, "b", seed=7, **sampled)
        other = await regenerate(peer, "c", seed=8, **sampled)
    assert again[-1]["text"] == first[-1]["text"] != other[-1]["text"]
    assert [f["turn"] for f in (first[-1], again[-1], other[-1])] == [1, 1, 1]
    prompt = first[0]["prompt_tokens"]
    assert again[0]["prompt_tokens"] == prompt and first[0]["cached_tokens"] == 0
    # under the window the cache is cut back to the prompt but its last token
    assert again[0]["cached_tokens"] == (prompt - 1 if prompt + tokens - 1 <= WINDOW else 0)

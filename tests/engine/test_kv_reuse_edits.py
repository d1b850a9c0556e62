"""KV reuse for a prompt that shares only a prefix with the cache (a rewind, a regenerate, an
edit), for both engines on the tiny random Gemma 3 in float32: the shared prefix is reused
within the sliding window, past it the ring marked at a turn boundary, and with images only
what comes before an image that changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import PIL.Image
import pytest
from transformers import Cache, DynamicCache
from wschat.server.engine.base import Finished, GenerationRequest, SamplingParams
from wschat.server.engine.history import Conversation
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.sequence_kv import KVState

from tests.engine.local_turns import (
    WINDOW,
    Engine,
    ask,
    engine_fixture,
    kv_bytes,
    load_widened,
    run,
    user_turn,
)
from tests.support import RawPeer, collect, raw_peer, running_server

engine = engine_fixture("tiny_text_loaded")


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


async def test_each_engines_kept_state_is_cut_back_by_the_one_reusable_in_its_own_form(
    engine: Engine,
) -> None:
    """``LocalModel.reusable`` serves both forms of kept state: the batch's ``KVState`` and
    ``generate``'s transformers ``Cache``."""
    first = [2, *words(engine, 5)]
    replied = await run(engine, first, "s")
    second = diverging(engine, [*first, *replied.completion_ids], 8)
    request = GenerationRequest(second, SamplingParams(max_new_tokens=1), session_key="s")
    kept = engine.taken(request, (KVState, Cache))
    assert kept is not None and len(kept.ids) == len(first) + 10 - 1
    form = type(kept.cache)
    cut = engine.reusable(kept, request)
    assert cut is not None and cut.ids == second[:8] and type(cut.cache) is form
    assert form is (KVState if isinstance(engine, BatchedEngine) else DynamicCache)


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


@pytest.fixture(scope="module")
def wide_vision_loaded(
    tiny_vision_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> LoadedModel:
    """The tiny vision model with a sliding window wider than the prompts here: its own (16)
    is no wider than an image's soft tokens, so no cache of an image could be cut back."""
    return load_widened(tiny_vision_dir, tmp_path_factory)


wide_vision_engine = engine_fixture("wide_vision_loaded")


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

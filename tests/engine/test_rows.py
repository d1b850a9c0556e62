"""``BatchRow`` and the ``OutputProcessor`` with the tiny model's tokenizer and streamer: what a
row tracks (the prompt it still has to feed, the tokens it took, why it ends), the one
``Finished`` it delivers, the KV state it leaves for the session's next turn, and a failure that
stays its own."""

from __future__ import annotations

import asyncio

import pytest
import torch
from wschat.protocol import FinishReason
from wschat.server.engine.base import (
    Finished,
    Generation,
    GenerationRequest,
    LoopBridge,
    SamplingParams,
)
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.kvstore import CachedPrefix, KVStore
from wschat.server.engine.local.output import OutputProcessor
from wschat.server.engine.local.rows import BatchRow
from wschat.server.engine.local.sampling import RowSampler
from wschat.server.engine.local.scheduler import RowState
from wschat.server.engine.local.sequence_kv import KVState
from wschat.server.engine.local.steps import RowEnd

from tests.support import collect


def make_row(
    engine: HFEngine,
    prompt: list[int],
    *,
    key: str = "",
    max_new_tokens: int = 8,
    prefix: CachedPrefix | None = None,
    stop: tuple[str, ...] = (),
) -> BatchRow:
    params = SamplingParams(max_new_tokens=max_new_tokens, stop=stop)
    request = GenerationRequest(prompt, params, session_key=key)
    generation = Generation(prompt_tokens=len(prompt))
    bridge = LoopBridge(asyncio.get_running_loop(), generation)
    return BatchRow(
        request,
        generation,
        bridge,
        engine.streamer(bridge, request),
        RowSampler(params, prompt, torch.device("cpu")),
        prefix,
        max_new_tokens,
        engine.prompt_format.end_ids,
    )


def state_of(length: int) -> KVState:
    return KVState(length, [(torch.zeros(1, length, 2),) * 2], [], 0)


@pytest.fixture
def prompt(tiny_text_engine: HFEngine) -> list[int]:
    return [2, *tiny_text_engine.tokenize_text("hello world hello world")]


async def test_a_row_feeds_only_the_prompt_its_cached_prefix_lacks(
    tiny_text_engine: HFEngine, prompt: list[int]
) -> None:
    state = state_of(3)
    cached = make_row(tiny_text_engine, prompt, prefix=CachedPrefix(state, prompt[:3], 0))
    fresh = make_row(tiny_text_engine, prompt)
    assert (cached.fed, cached.unfed, cached.prefix_state) == (3, len(prompt) - 3, state)
    assert (fresh.fed, fresh.unfed, fresh.prefix_state) == (0, len(prompt), None)
    assert cached.prompt_ids == prompt


async def test_a_row_ends_at_max_new_tokens_or_at_an_end_token(
    tiny_text_engine: HFEngine, prompt: list[int]
) -> None:
    output = OutputProcessor(KVStore(1 << 20))
    words = tiny_text_engine.tokenize_text("one two three")
    row = make_row(tiny_text_engine, prompt, max_new_tokens=3)
    assert [output.stream(row, t) for t in words[:3]] == [None, None, FinishReason.LENGTH]
    assert row.streamer.generated == words[:3] and row.last_token == words[2]
    (end, *_) = sorted(tiny_text_engine.prompt_format.end_ids)
    stopped = make_row(tiny_text_engine, prompt)
    assert [output.stream(stopped, t) for t in (words[0], end)] == [None, FinishReason.STOP]


async def test_a_stop_string_ends_the_row_on_the_token_that_completes_it(
    tiny_text_engine: HFEngine, prompt: list[int]
) -> None:
    output = OutputProcessor(KVStore(1 << 20))
    words = tiny_text_engine.tokenize_text("red green blue yellow")
    row = make_row(tiny_text_engine, prompt, stop=("blue",))
    through_blue = len(tiny_text_engine.tokenize_text("red green blue"))
    reasons = [output.stream(row, t) for t in words[:through_blue]]
    assert reasons == [None] * (through_blue - 1) + [FinishReason.STOP]


async def test_a_finished_row_delivers_one_finished_and_keeps_its_state_for_the_next_turn(
    tiny_text_engine: HFEngine, prompt: list[int]
) -> None:
    store = KVStore(1 << 20)
    output = OutputProcessor(store)
    row = make_row(tiny_text_engine, prompt, key="s", max_new_tokens=2)
    finishes: list[Finished] = []
    row.generation.on_finish.append(finishes.append)
    words = tiny_text_engine.tokenize_text("one two")
    reason = [output.stream(row, t) for t in words][-1]
    assert reason is FinishReason.LENGTH
    # the state holds the prompt and the first reply token (the last one is never fed)
    output.finish(row, reason, state_of(len(prompt) + 1))
    assert row.state is RowState.FINISHED
    output.finish(row, FinishReason.STOP, state_of(1))  # ignored: it has ended
    text, finished = await collect(row.generation)
    assert (finished.reason, finished.completion_ids, finished.error) == (
        FinishReason.LENGTH,
        tuple(words),
        None,
    )
    assert text and finishes == [finished]
    kept = store.take("s", [*prompt, *words, 7], KVState)
    assert kept is not None and kept.ids == [*prompt, words[0]]


async def test_a_rows_failure_ends_it_alone_and_leaves_no_state(
    tiny_text_engine: HFEngine, prompt: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = KVStore(1 << 20)
    output = OutputProcessor(store)
    failing = make_row(tiny_text_engine, prompt, key="a")
    mate = make_row(tiny_text_engine, prompt, key="b")
    boom = RuntimeError("its streamer broke")

    def broken(token: int) -> None:
        raise boom

    monkeypatch.setattr(failing.streamer, "push", broken)
    word = tiny_text_engine.tokenize_text("one")[0]
    assert output.take(failing, word) == RowEnd(FinishReason.ERROR, boom)
    assert output.take(mate, word) is None
    output.finish(failing, FinishReason.ERROR, state_of(len(prompt)), boom)
    assert output.stream(mate, word) is None
    output.finish(mate, FinishReason.STOP, state_of(len(prompt) + 1))
    (_, failed), (_, ended) = [await collect(r.generation) for r in (failing, mate)]
    assert (failed.reason, failed.error) == (FinishReason.ERROR, boom)
    assert (ended.reason, ended.error, ended.completion_ids) == (
        FinishReason.STOP,
        None,
        (word, word),
    )
    assert store.take("a", [*prompt, 1, 2], KVState) is None
    assert store.take("b", [*prompt, word, word, 3], KVState) is not None


async def test_a_cancelled_row_ends_cancelled_at_its_next_pick(
    tiny_text_engine: HFEngine, prompt: list[int]
) -> None:
    output = OutputProcessor(KVStore(1 << 20))
    row = make_row(tiny_text_engine, prompt)
    word = tiny_text_engine.tokenize_text("one")[0]
    assert output.take(row, word) is None
    row.generation.cancel()
    assert row.cancelled
    assert output.take(row, word) == RowEnd(FinishReason.CANCELLED)
    assert row.streamer.generated == [word]  # the pick after the cancel is not streamed


async def test_a_row_whose_store_fails_still_delivers_its_finished(
    tiny_text_engine: HFEngine, prompt: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = KVStore(1 << 20)
    output = OutputProcessor(store)

    def full(key: str, entry: CachedPrefix) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(store, "put", full)
    row = make_row(tiny_text_engine, prompt, key="s")
    output.stream(row, tiny_text_engine.tokenize_text("one")[0])
    with pytest.raises(MemoryError):
        output.finish(row, FinishReason.STOP, state_of(len(prompt)))
    _, finished = await collect(row.generation)
    assert finished.reason is FinishReason.STOP

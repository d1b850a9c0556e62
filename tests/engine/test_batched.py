"""``BatchedEngine`` on the tiny random Gemma 3 in float32: batched replies equal replies run
alone (``HFEngine``'s ``generate``), per row, whatever shares the batch.

The tiny model's sliding window is 16 tokens and the engine here prefills in chunks of 32, so
these prompts cross both the ring of the sliding layers and the chunking of long prompts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from wschat.server.engine.base import (
    CancelFlag,
    GenerationRequest,
    TokenPiece,
)
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions
from wschat.server.engine.local.output import OutputProcessor
from wschat.server.engine.local.precision import pick_precision
from wschat.server.engine.local.rows import BatchRow
from wschat.server.engine.local.sampling import RowSampler
from wschat.server.engine.local.sequence_kv import KVState
from wschat.server.engine.local.steps import StepKind, StepPlan

from tests.engine.batch_runs import WIDTH, alone, greedy, prompts
from tests.engine.hostile import HOSTILE_PARAMS
from tests.support import TIMEOUT, collect, wait_until


async def test_eight_concurrent_greedy_replies_equal_each_reply_run_alone(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    asks = prompts(batched, WIDTH)
    expected = [await alone(tiny_text_engine, ids, greedy(24)) for ids in asks]
    first = [batched.generate(GenerationRequest(ids, greedy(24))) for ids in asks[:4]]
    await wait_until(lambda: batched.decode_steps >= 2)  # the rest join a decoding batch
    later = [batched.generate(GenerationRequest(ids, greedy(24))) for ids in asks[4:]]
    results = await asyncio.gather(*(collect(g) for g in first + later))
    assert [text for text, _ in results] == expected
    assert {finished.reason.value for _, finished in results} == {"length"}
    assert batched.decoded_tokens > batched.decode_steps  # rows shared decode passes


async def test_greedy_replies_equal_generate_with_the_same_packed_weights(
    tiny_text_packed: LoadedModel,
) -> None:
    # float32 arithmetic (fp16-weights) picks the same tokens whatever shares the batch; bf16
    # rounds a row's sums otherwise as the batch's row count changes (plain bf16 as much as
    # packed), and int8 copies serve only narrow steps, so there each reply has the batch to
    # itself
    int8_steps = pick_precision(tiny_text_packed.precision_name, "cpu").int8_blocks
    together = tiny_text_packed.dtype == torch.float32 and not int8_steps
    batched = BatchedEngine(tiny_text_packed, LocalEngineOptions(width=WIDTH, prefill_tokens=32))
    single = HFEngine(tiny_text_packed)
    try:
        asks = prompts(batched, WIDTH)
        expected = [await alone(single, ids, greedy(24)) for ids in asks]
        if together:
            replies = [batched.generate(GenerationRequest(ids, greedy(24))) for ids in asks]
            texts = [text for text, _ in await asyncio.gather(*(collect(g) for g in replies))]
            assert batched.decoded_tokens > batched.decode_steps  # rows shared decode passes
        else:
            texts = [await alone(batched, ids, greedy(24)) for ids in asks]
        assert texts == expected
    finally:
        await batched.aclose()
        await single.aclose()


async def test_prompts_arriving_over_several_loop_iterations_share_one_prefill_forward(
    tiny_text_loaded: LoadedModel, tiny_text_engine: HFEngine
) -> None:
    # A window far longer than the gaps between the arrivals, in which the loop sits idle (as
    # between frames on different sockets): the burst is admitted together, not its first
    # prompt alone with the others waiting for its forward.
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=WIDTH, gather_s=2.0))
    try:
        asks = prompts(engine, 4)
        expected = [await alone(tiny_text_engine, ids, greedy(16)) for ids in asks]
        generations = []
        for ids in asks:
            generations.append(engine.generate(GenerationRequest(ids, greedy(16))))
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*(collect(g) for g in generations))
        assert [text for text, _ in results] == expected
        assert engine.prefill_forwards == 1
    finally:
        await engine.aclose()


async def test_a_burst_stays_whole_when_the_loop_is_held_up_between_two_of_its_prompts(
    tiny_text_loaded: LoadedModel, tiny_text_engine: HFEngine
) -> None:
    # The loop blocked far past the quiet gap after the first prompt (as by a thread start or a
    # collection, with the second frame already read): the worker waits for the loop to turn
    # before it takes the first prompt alone.
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=WIDTH))
    engine.scheduler.idle_gather_cap_s = 5.0  # the wait for the loop decides, not the cap
    try:
        asks = prompts(engine, 2)
        expected = [await alone(tiny_text_engine, ids, greedy(8)) for ids in asks]
        first = engine.generate(GenerationRequest(asks[0], greedy(8)))
        await asyncio.sleep(0)  # the worker starts and gathers
        time.sleep(20 * engine.scheduler.gather_s)
        second = engine.generate(GenerationRequest(asks[1], greedy(8)))
        results = await asyncio.gather(collect(first), collect(second))
        assert [text for text, _ in results] == expected
        assert engine.prefill_forwards == 1
    finally:
        await engine.aclose()


def passes(engine: BatchedEngine, count: int | None = None) -> None:
    """Run the worker's passes here, one at a time (its thread never starts): ``count`` of
    them, or until no row is left."""
    with torch.inference_mode():
        while count is None or count > 0:
            engine.scheduler.take_arrivals()
            if not (engine.scheduler.waiting or engine.scheduler.rows):
                return
            engine._pass()
            count = None if count is None else count - 1


async def test_rows_that_end_or_finish_their_prompt_while_others_prefill_keep_every_reply(
    batched: BatchedEngine, tiny_text_engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Passes in a known order: the decoding rows come first in the buffers and the prefilling
    # ones after them, so a short prompt done before a long one ahead of it (a swap of rows),
    # and a decoding row that ends while two prompts are still half prefilled (the last of
    # them moves into its place), must each keep every reply as it is alone.
    monkeypatch.setattr(BatchedEngine, "_wake", lambda self: None)
    asks = prompts(batched, 8)
    first, (long_a, short, long_b) = asks[0], (asks[7], asks[1], asks[6])
    expected = [await alone(tiny_text_engine, first, greedy(4))]
    expected += [await alone(tiny_text_engine, ids, greedy(10)) for ids in (long_a, short, long_b)]
    generations = [batched.generate(GenerationRequest(first, greedy(4)))]
    passes(batched, 1)  # its prefill and first decode step: 2 of its 4 tokens
    generations += [
        batched.generate(GenerationRequest(ids, greedy(10))) for ids in (long_a, short, long_b)
    ]
    passes(batched, 1)  # 16 tokens of each: the short prompt is done, second in line
    assert [row.request.prompt_ids for row in batched.scheduler.decoding] == [first, short]
    passes(batched, 1)  # the first row's last token: it ends with both long ones prefilling
    assert [row.request.prompt_ids for row in batched.scheduler.decoding] == [short]
    assert [row.request.prompt_ids for row in batched.scheduler.prefilling] == [long_b, long_a]
    passes(batched)
    results = await asyncio.gather(*(collect(g) for g in generations))
    assert [text for text, _ in results] == expected


async def test_cancel_in_a_batch_leaves_the_others_unchanged_and_ends_within_one_step(
    batched: BatchedEngine, tiny_text_engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    asks = prompts(batched, 4)
    expected = [await alone(tiny_text_engine, ids, greedy(40)) for ids in asks]
    # One log appended from the loop (cancel) and the worker (steps, finishes): list.append is
    # atomic, so its order is the order things happened.
    events: list[str] = []
    original_set, original_step, original_finish = (
        CancelFlag.set,
        BatchedEngine._step,
        OutputProcessor.finish,
    )

    def set_and_log(self: CancelFlag) -> None:
        original_set(self)
        events.append("cancel")

    def step_and_log(self: BatchedEngine, plan: StepPlan[BatchRow]) -> None:
        if plan.kind is StepKind.DECODE:
            events.append("step")
        original_step(self, plan)

    def finish_and_log(self: OutputProcessor, row: BatchRow, *args: Any, **kwargs: Any) -> None:
        events.append(f"finish {row.request.prompt_ids is asks[1]}")
        original_finish(self, row, *args, **kwargs)

    monkeypatch.setattr(CancelFlag, "set", set_and_log)
    monkeypatch.setattr(BatchedEngine, "_step", step_and_log)
    monkeypatch.setattr(OutputProcessor, "finish", finish_and_log)
    generations = [batched.generate(GenerationRequest(ids, greedy(40))) for ids in asks]
    async with asyncio.timeout(TIMEOUT):
        streamed = 0
        while streamed < 3:
            streamed += sum(isinstance(i, TokenPiece) for i in await generations[1].next_items())
    generations[1].cancel()
    results = await asyncio.gather(*(collect(g) for g in generations))
    texts = [text for text, _ in results]
    cancelled_text, cancelled = results[1]
    assert cancelled.reason.value == "cancelled"
    assert expected[1].startswith(cancelled_text) and cancelled_text != expected[1]
    assert texts[:1] + texts[2:] == expected[:1] + expected[2:]
    after_cancel = events[events.index("cancel") + 1 :]
    assert after_cancel[: after_cancel.index("finish True")].count("step") <= 1


async def test_seeded_sampling_gives_the_same_reply_whatever_its_batch_mates(
    batched: BatchedEngine,
) -> None:
    asks = prompts(batched, 4)
    sampled = greedy(30, temperature=0.9, top_p=0.9, top_k=40, repetition_penalty=1.3, seed=1234)
    reference = await alone(batched, asks[0], sampled)
    mates = [
        greedy(30, temperature=1.2, seed=7),
        greedy(30, temperature=0.7, top_p=0.5),  # unseeded
        greedy(30, repetition_penalty=1.5),
    ]
    generations = [batched.generate(GenerationRequest(asks[0], sampled))]
    generations += [
        batched.generate(GenerationRequest(ids, params))
        for ids, params in zip(asks[1:], mates, strict=True)
    ]
    results = await asyncio.gather(*(collect(g) for g in generations))
    assert results[0][0] == reference
    other_seed = await alone(batched, asks[0], greedy(30, temperature=0.9, top_k=40, seed=99))
    assert other_seed != reference  # the seed, not the batch, decides the draws


async def test_repetition_penalty_matches_generate_greedy(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    ids = prompts(batched, 3)[2]
    params = greedy(30, repetition_penalty=1.4)
    assert await alone(batched, ids, params) == await alone(tiny_text_engine, ids, params)


async def test_stop_string_ends_a_batched_reply_before_it(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    asks = prompts(batched, 3)
    full = await alone(tiny_text_engine, asks[0], greedy(20))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = full.index(stop)
    generations = [batched.generate(GenerationRequest(asks[0], greedy(20, stop=(stop,))))]
    generations += [batched.generate(GenerationRequest(ids, greedy(20))) for ids in asks[1:]]
    (text, finished), *_ = await asyncio.gather(*(collect(g) for g in generations))
    assert finished.reason.value == "stop"
    assert text == full[:cut]


async def test_second_turn_prefills_only_new_tokens_and_matches_a_fresh_session(
    batched: BatchedEngine,
) -> None:
    first_ids = prompts(batched, 2)[1]
    first = batched.generate(GenerationRequest(first_ids, greedy(12), session_key="s"))
    _, first_done = await collect(first)
    history = [*first_ids, *first_done.completion_ids, *batched.tokenize_text(" and then")]
    second = batched.generate(GenerationRequest(history, greedy(12), session_key="s"))
    text, done = await collect(second)
    # Everything but the last reply token (picked, never fed back) was cached.
    cached = len(first_ids) + len(first_done.completion_ids) - 1
    assert done.usage.cached_tokens == second.cached_tokens == cached
    fresh = await alone(batched, history, greedy(12))  # no session key: a full prefill
    assert text == fresh


async def test_hostile_but_valid_params_leave_the_batch_mates_greedy_replies_unchanged(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    mates = prompts(batched, WIDTH - len(HOSTILE_PARAMS))
    expected = [await alone(tiny_text_engine, ids, greedy(24)) for ids in mates]
    hostile = [greedy(24, **params) for params in HOSTILE_PARAMS]
    generations = [batched.generate(GenerationRequest(ids, greedy(24))) for ids in mates]
    generations += [
        batched.generate(GenerationRequest(ids, params))
        for ids, params in zip(prompts(batched, len(hostile)), hostile, strict=True)
    ]
    results = await asyncio.gather(*(collect(g) for g in generations))
    assert [text for text, _ in results[: len(mates)]] == expected
    assert [(f.reason.value, f.error) for _, f in results] == [("length", None)] * WIDTH
    assert batched.decoded_tokens > batched.decode_steps  # they shared decode passes


@pytest.mark.parametrize("fault", ["pick", "take"])
@pytest.mark.parametrize("at_token", [0, 5])  # 0: picked after prefill; 5: in a decode pass
async def test_a_failure_in_one_row_ends_that_row_alone(
    batched: BatchedEngine,
    tiny_text_engine: HFEngine,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    at_token: int,
) -> None:
    asks = prompts(batched, 4)
    sampled = greedy(20, temperature=0.8, seed=5)  # not plain greedy: its sampler picks alone
    expected = [await alone(tiny_text_engine, ids, greedy(20)) for ids in asks[1:]]
    expected_faulty = await alone(batched, asks[0], sampled)
    boom = RuntimeError("one row's fault")
    original_pick, original_stream = RowSampler.pick, OutputProcessor.stream
    picks = 0

    def pick_or_fail(self: RowSampler, logits: Any) -> int:
        nonlocal picks
        if self.params is sampled:
            picks += 1
            if picks > at_token:
                raise boom
        return original_pick(self, logits)

    def stream_or_fail(self: OutputProcessor, row: BatchRow, token: int) -> Any:
        if row.request.params is sampled and len(row.streamer.generated) == at_token:
            raise boom
        return original_stream(self, row, token)

    if fault == "pick":
        monkeypatch.setattr(RowSampler, "pick", pick_or_fail)
    else:
        monkeypatch.setattr(OutputProcessor, "stream", stream_or_fail)
    generations = [batched.generate(GenerationRequest(asks[0], sampled))]
    generations += [batched.generate(GenerationRequest(ids, greedy(20))) for ids in asks[1:]]
    results = await asyncio.gather(*(collect(g) for g in generations))
    (faulty_text, faulty_end), *mates = results
    assert (faulty_end.reason.value, faulty_end.error) == ("error", boom)
    assert expected_faulty.startswith(faulty_text)
    assert len(faulty_end.completion_ids) == at_token
    assert [text for text, _ in mates] == expected
    assert {(f.reason.value, f.error) for _, f in mates} == {("length", None)}


@pytest.mark.parametrize("cached", [5, 15, 16, 17, 40])  # around the sliding window of 16
def test_generates_kv_state_taken_into_the_batch_continues_as_one_full_forward(
    tiny_text_loaded: LoadedModel, cached: int
) -> None:
    """``KVState.of_cache``: a prefill of 5 tokens, then two decode steps, on the state of a
    transformers cache give the logits of one forward over everything."""
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=1))
    model = tiny_text_loaded.model
    ids = [2, *engine.tokenize_text("hello world " * 30)][: cached + 7]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:cached]]), cache=cache, use_cache=True)
        want = model(input_ids=torch.tensor([ids])).logits[0, cached:]
        runner = engine.runner
        runner.kv.add(KVState.of_cache(cache, runner.layout))
        prefill = torch.tensor([ids[cached : cached + 5]])
        got = [runner.logits(runner.forward(prefill, [5], first=0))]
        for position in (cached + 5, cached + 6):
            hidden = runner.forward(torch.tensor([[ids[position]]]), [1], first=0)
            got.append(runner.logits(hidden))
    torch.testing.assert_close(torch.cat([g[0] for g in got]), want.float())

"""``BatchedEngine`` on the tiny random Gemma 3 in float32: batched replies equal replies run
alone (``HFEngine``'s ``generate``), per row, whatever shares the batch; engine-level and over a
real server.

The tiny model's sliding window is 16 tokens and the engine here prefills in chunks of 32, so
these prompts cross both the ring of the sliding layers and the chunking of long prompts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from wschat.server.engine.base import (
    CancelFlag,
    GenerationRequest,
    SamplingParams,
    TokenPiece,
)
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.output import OutputProcessor
from wschat.server.engine.local.rows import BatchRow
from wschat.server.engine.local.sampling import RowSampler
from wschat.server.engine.local.sequence_kv import KVState

from tests.engine.hostile import HOSTILE_PARAMS
from tests.images import samples
from tests.support import TIMEOUT, RawPeer, collect, raw_peer, running_server, wait_until

WIDTH = 8


@pytest.fixture
async def batched(tiny_text_loaded: LoadedModel) -> AsyncIterator[BatchedEngine]:
    engine = BatchedEngine(tiny_text_loaded, width=WIDTH, prefill_tokens=32)
    yield engine
    await engine.aclose()


def prompts(engine: HFEngine | BatchedEngine, count: int) -> list[list[int]]:
    """Prompts of 3 to 60 tokens: shorter and longer than the window and the prefill chunk."""
    return [[2, *engine.tokenize_text("hello world " * (1 + 4 * i))] for i in range(count)]


def greedy(tokens: int, **extra: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, **extra)


async def alone(engine: HFEngine | BatchedEngine, ids: list[int], params: SamplingParams) -> str:
    text, finished = await collect(engine.generate(GenerationRequest(ids, params)))
    assert finished.error is None
    return text


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
    # packed), so there each reply has the batch to itself
    together = tiny_text_packed.dtype == torch.float32
    batched = BatchedEngine(tiny_text_packed, width=WIDTH, prefill_tokens=32)
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
    engine = BatchedEngine(tiny_text_loaded, width=WIDTH, gather_s=2.0)
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
    engine = BatchedEngine(tiny_text_loaded, width=WIDTH)
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
        BatchedEngine._decode_step,
        OutputProcessor.finish,
    )

    def set_and_log(self: CancelFlag) -> None:
        original_set(self)
        events.append("cancel")

    def step_and_log(self: BatchedEngine) -> None:
        events.append("step")
        original_step(self)

    def finish_and_log(self: OutputProcessor, row: BatchRow, *args: Any, **kwargs: Any) -> None:
        events.append(f"finish {row.request.prompt_ids is asks[1]}")
        original_finish(self, row, *args, **kwargs)

    monkeypatch.setattr(CancelFlag, "set", set_and_log)
    monkeypatch.setattr(BatchedEngine, "_decode_step", step_and_log)
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


async def ask(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


async def test_eight_sessions_over_a_server_get_the_replies_they_get_alone(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    texts = ["hello world " * (1 + 3 * i) for i in range(WIDTH)]
    expected = []
    async with running_server(tiny_text_engine, max_concurrent=1) as url:
        for text in texts:
            async with raw_peer(url) as (peer, _):
                expected.append((await ask(peer, "a", text, max_new_tokens=16))[-1]["text"])

    async def session(url: str, text: str) -> list[dict[str, Any]]:
        async with raw_peer(url) as (peer, ready):
            assert ready["engine"] == "batched"
            return await ask(peer, "a", text, max_new_tokens=16)

    async with running_server(batched, max_concurrent=WIDTH) as url:
        replies = await asyncio.gather(*(session(url, text) for text in texts))
    for frames, want in zip(replies, expected, strict=True):
        tokens = [f["text"] for f in frames if f["type"] == "token"]
        assert frames[-1]["text"] == "".join(tokens) == want


async def test_prompts_beyond_the_batch_width_are_queued_with_their_positions(
    tiny_text_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_text_loaded, width=2)
    try:
        async with (
            running_server(engine, max_concurrent=2, max_queue=4) as url,
            raw_peer(url) as (a, _),
            raw_peer(url) as (b, _),
            raw_peer(url) as (c, _),
            raw_peer(url) as (d, _),
        ):
            for peer in (a, b):
                await peer.send(
                    {
                        "type": "prompt",
                        "id": "p",
                        "text": "Go",
                        "params": {"max_new_tokens": 400},
                    }
                )
                await peer.recv_until("token")
            await c.send({"type": "prompt", "id": "p", "text": "Go"})
            assert (await c.recv_until("queued"))[-1]["position"] == 1
            await d.send({"type": "prompt", "id": "p", "text": "Go"})
            assert (await d.recv_until("queued"))[-1]["position"] == 2
            await a.send({"type": "cancel", "id": "p"})
            assert (await a.recv_until("done"))[-1]["reason"] == "cancelled"
            assert (await d.recv_until("queued"))[-1]["position"] == 1
            started = await c.recv_until("start")
            assert started[-1]["type"] == "start"
            await b.send({"type": "cancel", "id": "p"})
            await c.send({"type": "cancel", "id": "p"})
            for peer in (b, c, d):
                assert (await peer.recv_until("done"))[-1]["type"] == "done"
    finally:
        await engine.aclose()


async def test_an_image_conversations_text_only_turns_run_in_the_batch_and_equal_generate(
    tiny_vision_loaded: LoadedModel,
) -> None:
    """Turns with new images run in generate; the turns after them without images come back to
    the batch on generate's KV state (image tokens included), and every reply equals that of an
    engine that re-encodes every image and prefills everything each turn."""
    engine = BatchedEngine(tiny_vision_loaded, prefill_tokens=32)
    twin = HFEngine(tiny_vision_loaded, kv_budget_bytes=0)
    turns = [
        ("What is this?", [samples.png()]),
        ("And now? " * 6, None),  # a tail longer than the sliding window (16)
        ("Once more.", None),
        ("Compare it with this one.", [samples.jpeg(32, 32)]),
        ("Which one is larger?", None),
    ]
    replies: dict[str, list[list[dict[str, Any]]]] = {"batched": [], "twin": []}
    paths: list[dict[str, int]] = []
    try:
        for name, each in (("batched", engine), ("twin", twin)):
            async with running_server(each) as url, raw_peer(url) as (peer, ready):
                assert ready["capabilities"] == {"images": True, "max_images": 4}
                for n, (text, images) in enumerate(turns):
                    frame: dict[str, Any] = {
                        "type": "prompt",
                        "id": str(n),
                        "text": text,
                        "params": {"max_new_tokens": 6},
                    }
                    if images:
                        frame["images"] = images
                    await peer.send(frame)
                    replies[name].append(await peer.recv_until("done"))
                    paths.append(dict(engine.image_turns))
    finally:
        await engine.aclose()
        await twin.aclose()
    assert [r[-1]["text"] for r in replies["batched"]] == [r[-1]["text"] for r in replies["twin"]]
    assert all(r[-1]["reason"] == "length" for r in replies["batched"])
    assert paths[:5] == [
        {"generate": 1, "batch": 0},
        {"generate": 1, "batch": 1},
        {"generate": 1, "batch": 2},
        {"generate": 2, "batch": 2},
        {"generate": 2, "batch": 3},
    ]
    assert engine.decode_steps > 0
    cached = [r[0]["cached_tokens"] for r in replies["batched"]]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:3] + cached[4:])


async def test_a_text_turn_whose_image_state_was_evicted_re_encodes_in_generate(
    tiny_vision_loaded: LoadedModel,
) -> None:
    engine = BatchedEngine(tiny_vision_loaded, kv_budget_bytes=0)  # keeps nothing
    try:
        async with running_server(engine) as url, raw_peer(url) as (peer, _):
            frame = {
                "type": "prompt",
                "id": "a",
                "text": "What is this?",
                "images": [samples.png()],
                "params": {"max_new_tokens": 5},
            }
            await peer.send(frame)
            with_image = await peer.recv_until("done")
            text_only = await ask(peer, "b", "And now?", max_new_tokens=5)
    finally:
        await engine.aclose()
    assert with_image[0]["prompt_tokens"] > len(engine.image_placeholder_ids())
    assert engine.image_turns == {"generate": 2, "batch": 0}
    assert engine.decode_steps == 0
    assert text_only[0]["cached_tokens"] == 0 and text_only[-1]["reason"] == "length"


async def reply(url: str, text: str, **params: Any) -> list[dict[str, Any]]:
    async with raw_peer(url) as (peer, _):
        return await ask(peer, "a", text, **params)


async def test_cancel_of_one_session_over_a_server_leaves_its_batch_mates_unchanged(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    mates = ["hello world " * 3, "hello world " * 9]
    async with running_server(tiny_text_engine, max_concurrent=1) as url:
        expected = [(await reply(url, text, max_new_tokens=30))[-1]["text"] for text in mates]
    async with running_server(batched, max_concurrent=WIDTH) as url, raw_peer(url) as (peer, _):
        await peer.send(
            {"type": "prompt", "id": "c", "text": "Go", "params": {"max_new_tokens": 400}}
        )
        await peer.recv_until("token")
        others = [asyncio.create_task(reply(url, text, max_new_tokens=30)) for text in mates]
        await wait_until(lambda: batched.scheduler.decoding_count == 3)  # all three decode together
        await peer.send({"type": "cancel", "id": "c"})
        cancelled = (await peer.recv_until("done"))[-1]
        async with asyncio.timeout(TIMEOUT):
            texts = [frames[-1]["text"] for frames in await asyncio.gather(*others)]
    assert cancelled["reason"] == "cancelled"
    assert cancelled["usage"]["completion_tokens"] < 400
    assert texts == expected


async def test_seeded_sampling_and_stop_strings_over_a_server_ignore_batch_mates(
    batched: BatchedEngine,
) -> None:
    sampled = {"max_new_tokens": 20, "temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 42}
    async with running_server(batched, max_concurrent=WIDTH) as url:
        alone_sampled = (await reply(url, "Once", **sampled))[-1]["text"]
        full = (await reply(url, "Tell me", max_new_tokens=16))[-1]["text"]
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        mates = [reply(url, "hello world " * i, max_new_tokens=20, temperature=1.0) for i in (2, 5)]
        together = await asyncio.gather(
            reply(url, "Once", **sampled),
            reply(url, "Tell me", max_new_tokens=16, stop=[stop]),
            *mates,
        )
    assert together[0][-1]["text"] == alone_sampled
    stopped = together[1][-1]
    assert stopped["reason"] == "stop"
    assert stopped["text"] == full[: full.index(stop)]


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


async def test_hostile_sessions_over_a_server_cost_their_batch_mates_nothing(
    batched: BatchedEngine, tiny_text_engine: HFEngine
) -> None:
    """PROTOCOL.md "params" ranges on the wire: each session's reply ends normally, and the
    greedy ones are what they are alone."""
    mates = ["hello world " * 2, "hello world " * 7]
    async with running_server(tiny_text_engine, max_concurrent=1) as url:
        expected = [(await reply(url, text, max_new_tokens=20))[-1]["text"] for text in mates]
    async with running_server(batched, max_concurrent=WIDTH) as url:
        replies = await asyncio.gather(
            *(reply(url, text, max_new_tokens=20) for text in mates),
            *(reply(url, "Go", max_new_tokens=20, **params) for params in HOSTILE_PARAMS),
        )
    assert [frames[-1]["text"] for frames in replies[: len(mates)]] == expected
    assert [frames[-1]["type"] for frames in replies] == ["done"] * len(replies)
    assert {frames[-1]["reason"] for frames in replies} == {"length"}
    assert not [f for frames in replies for f in frames if f["type"] == "error"]


@pytest.mark.parametrize("cached", [5, 15, 16, 17, 40])  # around the sliding window of 16
def test_generates_kv_state_taken_into_the_batch_continues_as_one_full_forward(
    tiny_text_loaded: LoadedModel, cached: int
) -> None:
    """``KVState.of_cache``: a prefill of 5 tokens, then two decode steps, on the state of a
    transformers cache give the logits of one forward over everything."""
    engine = BatchedEngine(tiny_text_loaded, width=1)
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

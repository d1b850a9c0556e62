"""``BatchedEngine`` behind a real server, on the tiny random Gemma 3 in float32: each session gets
the reply it gets alone, whatever its batch mates do (cancel, seeds, stop strings, hostile
parameters), and prompts beyond the batch width wait in the queue with their positions."""

from __future__ import annotations

import asyncio
from typing import Any

from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.options import LocalEngineOptions

from tests.engine.batch_runs import WIDTH
from tests.engine.hostile import HOSTILE_PARAMS
from tests.engine.local_turns import ask
from tests.support import TIMEOUT, raw_peer, running_server, wait_until


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
    engine = BatchedEngine(tiny_text_loaded, LocalEngineOptions(width=2))
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

"""wschat with ``--engine openai`` in front of a real llama.cpp server (``xllamacpp``) on the
embedded Gemma 3 270M: the same protocol, replies from the engine."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from wschat.protocol import ErrorCode, FinishReason
from wschat.server.engine import GenerationRequest, SamplingParams
from wschat.server.engine.errors import ContextExhausted
from wschat.server.engine.history import Conversation
from wschat.server.engine.openai import OpenAIEngine, connect
from wschat.server.engine.openai.tokenizer import TokenizerError, embedded_tokenizer
from wschat.server.sessions.error_boundary import error_frame

from tests.openai.llama import SLOT_CONTEXT, LlamaServer
from tests.support import (
    TIMEOUT,
    RawPeer,
    collect,
    http_base,
    raw_peer,
    running_server,
    wait_until,
)

# One line of many tokens: long enough to be cancelled mid-reply.
LONG = "Write the numbers from 1 to 200 separated by spaces."
IDLE_WITHIN_S = 1.0


async def prompt(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


async def test_reply_streams_from_llama_cpp_and_greedy_equals_its_own_greedy(
    openai_engine: OpenAIEngine, live_llama: LlamaServer
) -> None:
    question = "What is the capital of France?"
    async with running_server(openai_engine) as url, raw_peer(url) as (peer, ready):
        assert ready["engine"] == "openai" and ready["model"] == openai_engine.model
        assert ready["limits"]["context_tokens"] == SLOT_CONTEXT  # the engine's, under ours
        frames = await prompt(peer, "a", question, temperature=0.0, max_new_tokens=24)
    done = frames[-1]
    tokens = [f for f in frames if f["type"] == "token"]
    assert frames[0]["type"] == "start" and done["reason"] in ("stop", "length")
    assert tokens and "".join(t["text"] for t in tokens) == done["text"]
    conversation = Conversation(openai_engine.prompt_format)
    ids = conversation.prompt_ids(conversation.tokenize_user(question))
    stop = ["\nUser:", "\nAssistant:"]  # the transcript's turn labels, where a line starts
    own = await asyncio.to_thread(
        live_llama.complete,
        {"prompt": ids, "max_tokens": 24, "temperature": 0.0, "stop": stop},
    )
    assert done["text"] == own["choices"][0]["text"].removeprefix(" ").strip("\n")


async def test_second_turn_reuses_the_first_turns_cache(openai_engine: OpenAIEngine) -> None:
    async with running_server(openai_engine) as url, raw_peer(url) as (peer, _):
        first = (await prompt(peer, "a", "What is the capital of France?", max_new_tokens=16))[-1]
        second = (await prompt(peer, "b", "And of Germany?", max_new_tokens=16))[-1]
    assert first["usage"]["prompt_tokens"] < second["usage"]["prompt_tokens"]
    assert second["usage"]["cached_tokens"] > first["usage"]["prompt_tokens"] // 2


async def test_seeded_sampling_repeats_and_a_stop_string_ends_the_reply(
    openai_engine: OpenAIEngine,
) -> None:
    sampled = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "max_new_tokens": 20}
    async with running_server(openai_engine) as url, raw_peer(url) as (peer, _):
        one = (await prompt(peer, "a", "Tell me about cats.", seed=1234, **sampled))[-1]
        await peer.send({"type": "reset"})
        await peer.recv_until("reset_ok")
        two = (await prompt(peer, "b", "Tell me about cats.", seed=1234, **sampled))[-1]
        await peer.send({"type": "reset"})
        await peer.recv_until("reset_ok")
        stopped = (
            await prompt(peer, "c", "What is the capital of France?", stop=[" of"], temperature=0)
        )[-1]
    assert one["text"] and one["text"] == two["text"]
    assert stopped["reason"] == "stop" and stopped["text"] == "The capital"


async def test_a_temperature_penalty_or_top_p_near_zero_is_served_as_its_limit(
    openai_engine: OpenAIEngine,
) -> None:
    """Values inside the protocol's ranges that are 0 or past float32's range once an engine
    divides by them reply as their limit does, as in process, never ``internal``: a
    temperature or a top-p near 0 is greedy, a penalty near 0 is one of 1e-10."""
    cases = {
        "greedy": {"temperature": 0.0},
        "temperature": {"temperature": 1e-38, "seed": 1},
        "top_p": {"temperature": 1.0, "top_p": 1e-300, "seed": 1},
        "penalty": {"temperature": 0.0, "repetition_penalty": 1e-300},
        "small penalty": {"temperature": 0.0, "repetition_penalty": 1e-10},
    }
    dones: dict[str, dict[str, Any]] = {}
    async with running_server(openai_engine) as url, raw_peer(url) as (peer, _):
        for name, params in cases.items():
            frames = await prompt(peer, name, "Name three colours.", max_new_tokens=12, **params)
            dones[name] = frames[-1]
            await peer.send({"type": "reset"})
            await peer.recv_until("reset_ok")
    reasons = {name: done["reason"] for name, done in dones.items()}
    assert set(reasons.values()) <= {"stop", "length"}, reasons
    texts = {name: done["text"] for name, done in dones.items()}
    assert texts["temperature"] == texts["top_p"] == texts["greedy"], texts
    assert texts["penalty"] == texts["small penalty"], texts


async def _cancelled_then_idle(
    live_llama: LlamaServer, engine: OpenAIEngine, how: str
) -> tuple[str | None, float]:
    """A long reply stopped mid-way by ``how``; the done reason (None after a drop) and the
    seconds from the stop until llama.cpp's slots are all idle. No resume grace: a drop ends
    the reply at once, as a cancel does."""
    async with running_server(engine, resume_grace_s=0.0) as url:
        async with raw_peer(url) as (peer, _):
            await peer.send(
                {"type": "prompt", "id": "a", "text": LONG, "params": {"max_new_tokens": 400}}
            )
            await peer.recv_until("token")
            assert await asyncio.to_thread(live_llama.busy_slots) == 1
            stopped_at = time.monotonic()
            if how == "drop":
                peer.ws.transport.abort()
                reason = None
            else:
                await peer.send({"type": "cancel"} if how == "cancel" else {"type": "reset"})
                frames = await peer.recv_until("done")
                reason = frames[-1]["reason"]
        await wait_until(lambda: live_llama.busy_slots() == 0, timeout=5, interval=0.02)
        return reason, time.monotonic() - stopped_at


@pytest.mark.parametrize("how", ["cancel", "reset"])
async def test_cancel_and_reset_close_the_stream_and_the_engine_goes_idle(
    openai_engine: OpenAIEngine, live_llama: LlamaServer, how: str
) -> None:
    reason, seconds = await _cancelled_then_idle(live_llama, openai_engine, how)
    assert reason == "cancelled"
    assert seconds < IDLE_WITHIN_S, seconds


async def test_a_client_that_drops_mid_reply_with_no_grace_leaves_the_engine_idle(
    openai_engine: OpenAIEngine, live_llama: LlamaServer
) -> None:
    _, seconds = await _cancelled_then_idle(live_llama, openai_engine, "drop")
    assert seconds < IDLE_WITHIN_S, seconds


async def test_an_api_stream_its_client_drops_stops_the_engines_reply(
    openai_engine: OpenAIEngine, live_llama: LlamaServer
) -> None:
    """The API's disconnect cancels the reply as a WebSocket drop does: the engine stops
    within a few tokens, where the reply would have run to its 400."""
    before = await asyncio.to_thread(live_llama.predicted_tokens)
    body = {"model": "any", "messages": [{"role": "user", "content": LONG}], "stream": True}
    async with running_server(openai_engine) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        chat = f"{http_base(url)}/v1/chat/completions"
        async with http.stream("POST", chat, json={**body, "max_tokens": 400}) as response:
            events = 0
            async for line in response.aiter_lines():
                events += line.startswith("data:")
                if events == 5:
                    break  # leaving the block closes the connection mid-stream
        await wait_until(lambda: live_llama.busy_slots() == 0, timeout=TIMEOUT, interval=0.05)
    generated = await asyncio.to_thread(live_llama.predicted_tokens) - before
    assert 4 <= generated < 50, generated


async def test_an_engine_killed_mid_reply_gives_error_then_the_session_goes_on(
    openai_engine: OpenAIEngine, live_llama: LlamaServer
) -> None:
    async with running_server(openai_engine) as url, raw_peer(url) as (peer, _):
        readyz = f"{http_base(url)}/readyz"
        await peer.send(
            {"type": "prompt", "id": "a", "text": LONG, "params": {"max_new_tokens": 400}}
        )
        await peer.recv_until("token")
        await asyncio.to_thread(live_llama.stop)
        frames = await peer.recv_until("done")
        errors = [f for f in frames if f["type"] == "error"]
        assert [e["code"] for e in errors] == ["internal"] and frames[-1]["reason"] == "error"
        async with httpx.AsyncClient(timeout=5) as http:
            await asyncio.sleep(1.1)  # readyz asks the engine at most once a second
            assert (await http.get(readyz)).status_code == 503
            refused = [f for f in await prompt(peer, "b", "Hello?") if f["type"] == "error"]
            assert [f["code"] for f in refused] == ["overloaded"]
            assert "retry in" in refused[0]["message"]
            await asyncio.to_thread(live_llama.start)
            await asyncio.sleep(1.1)
            assert (await http.get(readyz)).status_code == 200
        again = await prompt(peer, "c", "What is the capital of France?", max_new_tokens=8)
    assert again[-1]["reason"] in ("stop", "length") and again[-1]["text"]


async def test_readyz_waits_for_an_engine_that_is_down_at_start(live_llama: LlamaServer) -> None:
    await asyncio.to_thread(live_llama.stop)
    factory = lambda: connect(live_llama.config())  # noqa: E731
    async with running_server(factory) as url, httpx.AsyncClient(timeout=5) as http:
        readyz = f"{http_base(url)}/readyz"
        assert (await http.get(readyz)).status_code == 503
        await asyncio.to_thread(live_llama.start)
        async with asyncio.timeout(30):  # another process: nothing to await but its answer
            while (await http.get(readyz)).status_code != 200:
                await asyncio.sleep(0.1)
        body = (await http.get(readyz)).json()
    assert body["engine"] == "openai" and body["ready"] is True


async def test_a_prompt_over_the_engines_context_is_context_overflow(
    openai_engine: OpenAIEngine,
) -> None:
    # The gateway believes in a larger context than the engine's slot has: the engine refuses.
    openai_engine.info = dataclasses.replace(openai_engine.info, context_tokens=100_000)
    ids = openai_engine.tokenizer.tokenize_text("word " * (SLOT_CONTEXT + 100))
    request = GenerationRequest(ids, SamplingParams(max_new_tokens=8), session_key="k")
    _, finished = await collect(openai_engine.generate(request))
    assert finished.reason is FinishReason.ERROR
    assert isinstance(finished.error, ContextExhausted)
    assert error_frame(finished.error, "g").code is ErrorCode.CONTEXT_OVERFLOW


async def test_a_tokenizer_that_differs_from_the_engines_is_refused_at_start(
    live_llama: LlamaServer, tmp_path: Path
) -> None:
    spec = json.loads(embedded_tokenizer(live_llama.config().cache_dir).read_text())
    spec["model"]["merges"] = spec["model"]["merges"][:1000]  # most words split otherwise
    wrong = tmp_path / "tokenizer.json"
    wrong.write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="does not match the engine"):
        await asyncio.to_thread(connect, live_llama.config(tokenizer=str(wrong)))

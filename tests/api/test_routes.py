"""The API's routes against a real uvicorn (web/openai_api/routes.py): the wire format of a
stream (read raw, without the SDK), completions from text or ids, the model list, bearer tokens,
and a request's life in the shared slots: a client that leaves frees its slot, a full queue is
429 with ``Retry-After``, a reply that fails mid-stream ends with an error event."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.api.support import async_client, user, websocket_replies
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import (
    TIMEOUT,
    http_base,
    next_stats,
    raw_peer,
    running_server,
    stats_socket,
    wait_until,
)

if TYPE_CHECKING:
    from wschat.server.engine import GenerationRequest
    from wschat.server.engine.local.hf import HFEngine

LONG = 1000  # max_tokens that asks the scripted engine for a reply slower than any test


def slow_when_long(request: GenerationRequest) -> Script:
    """A reply of 4 words, or, for ``LONG`` tokens, one that runs for minutes unless cancelled."""
    n = request.params.max_new_tokens
    if n >= LONG:
        return Script([f" w{i}" for i in range(n)], delay_s=0.2)
    return Script([f" w{i}" for i in range(4)])


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "any", "messages": [user("Hi")], **fields}


async def metric(base: str, name: str) -> float:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        text = (await client.get(f"{base}/metrics")).text
    values = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(values[0]) if values else 0.0


async def slots_reach(url: str, *, running: int, queued: int) -> None:
    """Until ``/v1/stats`` says the slots hold that many (a frame a second)."""
    async with stats_socket(url) as ws, asyncio.timeout(TIMEOUT):
        while True:
            stats = await next_stats(ws)
            if (stats.running, stats.queued) == (running, queued):
                return


async def test_a_raw_stream_is_data_lines_of_chunks_then_done() -> None:
    async with running_server(ScriptedEngine()) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        payload = body(stream=True, stream_options={"include_usage": True})
        async with http.stream("POST", f"{http_base(url)}/v1/chat/completions", json=payload) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = (await r.aread()).decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert text == " w0 w1 w2 w3 w4 w5 w6 w7"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


async def test_completions_take_a_prompt_string_or_token_ids(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        from_text = await client.completions.create(model="any", prompt="Once upon", max_tokens=6)
        ids = tiny_engine.prompt_format.tokenize_system("Once upon")
        from_ids = await client.completions.create(model="any", prompt=ids, max_tokens=6)
        stream = await client.completions.create(model="any", prompt=ids, max_tokens=6, stream=True)
        streamed = "".join([c.choices[0].text async for c in stream if c.choices])
    assert from_text.object == "text_completion"
    assert from_text.choices[0].text == from_ids.choices[0].text == streamed != ""
    assert from_ids.usage is not None and from_ids.usage.prompt_tokens == len(ids)
    assert from_ids.choices[0].finish_reason == "length"


async def test_every_sampling_field_of_a_request_reaches_the_engine() -> None:
    engine = ScriptedEngine()
    fields = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "seed": 9}
    async with running_server(engine) as url, httpx.AsyncClient(timeout=TIMEOUT) as http:
        answer = await http.post(
            f"{http_base(url)}/v1/chat/completions",
            json=body(repetition_penalty=1.1, max_tokens=4, **fields),
        )
    assert answer.status_code == 200
    params = engine.requests[0].params
    assert {name: getattr(params, name) for name in fields} == fields
    assert params.repetition_penalty == 1.1 and params.max_new_tokens == 4


async def test_the_model_list_names_the_model_served() -> None:
    async with running_server(ScriptedEngine()) as url, async_client(url) as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == ["scripted"]


async def test_a_request_without_the_bearer_token_is_401_in_the_api_shape() -> None:
    async with running_server(ScriptedEngine(), tokens=("secret",)) as url:
        async with async_client(url, "wrong") as client:
            with pytest.raises(openai.AuthenticationError) as refused:
                await client.chat.completions.create(model="any", messages=[user("Hi")])
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            bare = await http.get(f"{http_base(url)}/v1/models")
        async with async_client(url, "secret") as client:
            reply = await client.chat.completions.create(model="any", messages=[user("Hi")])
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "message": "the bearer token is not one this server accepts",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    assert bare.json()["error"]["code"] == "invalid_api_key"
    assert reply.choices[0].message.content == " w0 w1 w2 w3 w4 w5 w6 w7"


async def test_a_client_that_leaves_mid_stream_frees_its_slot() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with running_server(engine, max_concurrent=1) as url:
        base = http_base(url)
        async with async_client(url) as client:
            stream = await client.chat.completions.create(
                model="any", messages=[user("Hi")], max_tokens=LONG, stream=True
            )
            async with asyncio.timeout(TIMEOUT):
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        break  # a token came: it runs, in the one slot
            await stream.close()
            # would wait for the long reply's slot for minutes, were it not freed
            reply = await client.chat.completions.create(model="any", messages=[user("Hi")])
        assert reply.choices[0].message.content == " w0 w1 w2 w3"
        assert await metric(base, "wschat_cancellations_total") == 1
        assert await metric(base, "wschat_generations_running") == 0
    assert not engine.threads


async def test_a_full_queue_is_429_with_retry_after() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with running_server(engine, max_concurrent=1, max_queue=1) as url:
        base = http_base(url)
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            endpoint = f"{base}/v1/chat/completions"
            running = asyncio.create_task(http.post(endpoint, json=body(max_tokens=LONG)))
            await wait_until(lambda: engine.requests)
            queued = asyncio.create_task(http.post(endpoint, json=body(max_tokens=LONG)))
            await slots_reach(url, running=1, queued=1)
            refused = await http.post(endpoint, json=body())
            for task in (running, queued):
                task.cancel()
            await asyncio.gather(running, queued, return_exceptions=True)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json() == {
            "error": {
                "message": "the server is at capacity (1 prompts already waiting)",
                "type": "rate_limit_error",
                "param": None,
                "code": "overloaded",
            }
        }
        await slots_reach(url, running=0, queued=0)  # both cancelled as their clients left


async def test_a_reply_that_fails_mid_stream_ends_with_an_error_event() -> None:
    engine = ScriptedEngine(lambda _: Script([" a", " b", " c"], fail_after=2))
    async with running_server(engine) as url, async_client(url) as client:
        stream = await client.chat.completions.create(
            model="any", messages=[user("Hi")], stream=True
        )
        texts = []
        with pytest.raises(openai.APIError) as failed:
            async for chunk in stream:
                texts += [c.delta.content or "" for c in chunk.choices]
    assert "".join(texts) == " a b"
    assert failed.value.body == {
        "message": "generation failed",
        "type": "server_error",
        "param": None,
        "code": "internal",
    }


async def test_generations_are_counted_by_api_and_a_running_request_is_a_stats_row() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with running_server(engine) as url, async_client(url) as client:
        await websocket_replies(url, ["Hi"])
        await client.chat.completions.create(model="any", messages=[user("Hi")])
        stream = await client.chat.completions.create(
            model="any", messages=[user("Hi")], max_tokens=LONG, stream=True
        )
        async with stats_socket(url) as ws, asyncio.timeout(TIMEOUT):
            rows: tuple[Any, ...] = ()
            while not rows:
                rows = (await next_stats(ws)).live
        await stream.close()
        await slots_reach(url, running=0, queued=0)
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            scraped = (await http.get(f"{http_base(url)}/metrics")).text
    assert [(row["api"], row["state"]) for row in rows] == [("openai", "running")]
    assert 'wschat_generations_total{api="websocket"} 1.0' in scraped
    assert 'wschat_generations_total{api="openai"} 2.0' in scraped


async def test_a_request_waits_in_the_sessions_queue_in_its_arrival_order() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with (
        running_server(engine, max_concurrent=1) as url,
        raw_peer(url) as (first, _),
        raw_peer(url) as (later, _),
        httpx.AsyncClient(timeout=TIMEOUT) as http,
    ):
        long = {"max_new_tokens": LONG}
        await first.send({"type": "prompt", "id": "a", "text": "Hi", "params": long})
        await first.recv_until("token")
        request = asyncio.create_task(
            http.post(
                f"{http_base(url)}/v1/completions",
                json={"model": "any", "prompt": "Hi", "max_tokens": 4},
            )
        )
        await slots_reach(url, running=1, queued=1)
        await later.send(
            {"type": "prompt", "id": "b", "text": "Hi", "params": {"max_new_tokens": 4}}
        )
        queued = (await later.recv_until("queued"))[-1]
        await first.send({"type": "cancel", "id": "a"})
        async with asyncio.timeout(TIMEOUT):
            answered = await request
        await later.recv_until("done")
    assert queued["position"] == 2  # behind the request, which came first
    assert answered.json()["choices"][0]["text"] == " w0 w1 w2 w3"
    # the engine ran them in the order they came: the long one, the request, the later prompt
    assert [r.params.max_new_tokens for r in engine.requests] == [LONG, 4, 4]
    assert engine.requests[1].prompt_ids == engine.tokenize_text("Hi")  # the raw completion

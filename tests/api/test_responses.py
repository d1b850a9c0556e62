"""The Responses API through the official ``openai`` SDK against a real uvicorn:
``responses.create`` streamed and whole (sync and async), ``retrieve``, ``delete`` and ``cancel``,
a continuation by
``previous_response_id`` over HTTP, and ``responses.connect()`` (the WebSocket mode) for three
turns on one socket, two lanes at once and a cancel mid-response. On the tiny model a response
is the chat API's reply to the same conversation, token for token: one session core behind both
doors."""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import openai
import pytest
from openai.lib.responses_websocket import AsyncResponsesWebSocketSession, ResponsesWebSocketLimits

from tests.api.support import assistant, async_client, sync_client, user
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, running_server, wait_until

if TYPE_CHECKING:
    from wschat.server.engine import GenerationRequest
    from wschat.server.engine.local.hf import HFEngine

LONG = 1000  # max_output_tokens that asks the scripted engine for a reply slower than any test
LIMITS = ResponsesWebSocketLimits(
    max_lanes=4,
    max_events_per_lane=4096,
    max_events=8192,
    max_bytes_per_lane=1 << 24,
    max_bytes=1 << 25,
)


def slow_when_long(request: GenerationRequest) -> Script:
    n = request.params.max_new_tokens
    if n >= LONG:
        return Script([f" w{i}" for i in range(n)], delay_s=0.05)
    return Script([f" w{i}" for i in range(4)])


async def test_a_response_is_the_chat_apis_reply_streamed_or_whole(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        whole = await client.responses.create(
            model="any", input="Hello there", max_output_tokens=12
        )
        stream = await client.responses.create(
            model="any", input="Hello there", max_output_tokens=12, stream=True
        )
        deltas, types = [], []
        async with asyncio.timeout(TIMEOUT):
            async for event in stream:
                types.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
        chat = await client.chat.completions.create(
            model="any", messages=[user("Hello there")], max_tokens=12
        )
    assert whole.output_text == "".join(deltas) == chat.choices[0].message.content != ""
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage is not None and chat.usage is not None
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == 12
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]


async def test_a_continuation_is_the_chats_next_reply_with_its_prefix_cached(
    tiny_engine: HFEngine,
) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        first = await client.responses.create(
            model="any", input="Hello there", instructions="Be brief.", max_output_tokens=8
        )
        second = await client.responses.create(
            model="any",
            input="And then?",
            instructions="Be brief.",
            previous_response_id=first.id,
            max_output_tokens=8,
        )
        chat = await client.chat.completions.create(
            model="any",
            messages=[
                {"role": "system", "content": "Be brief."},
                user("Hello there"),
                assistant(first.output_text),
                user("And then?"),
            ],
            max_tokens=8,
        )
    assert second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    # the first turn's prompt and reply were prefilled once: the second reads them from the cache
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens + first.usage.output_tokens - 1
    assert chat.usage is not None and second.usage.input_tokens == chat.usage.prompt_tokens


def test_the_sync_client_creates_streams_retrieves_and_deletes() -> None:
    async def serve() -> None:
        async with running_server(ScriptedEngine()) as url:
            await asyncio.to_thread(use, url)

    def use(url: str) -> None:
        with sync_client(url) as client:
            made = client.responses.create(model="any", input="Hi")
            with client.responses.stream(model="any", input="Hi") as stream:
                streamed = stream.get_final_response()
            assert made.status == streamed.status == "completed"
            assert made.output_text == streamed.output_text == " w0 w1 w2 w3 w4 w5 w6 w7"
            assert client.responses.retrieve(made.id).output_text == made.output_text
            client.responses.delete(made.id)
            with pytest.raises(openai.NotFoundError) as gone:
                client.responses.retrieve(made.id)
            assert gone.value.body == {
                "message": f"No response found with id {made.id!r}.",
                "type": "invalid_request_error",
                "param": None,
                "code": "not_found",
            }

    asyncio.run(serve())


async def test_a_response_cancelled_mid_stream_ends_cancelled_and_frees_its_slot() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with running_server(engine, max_concurrent=1) as url, async_client(url) as client:
        stream = await client.responses.create(
            model="any", input="Hi", max_output_tokens=LONG, stream=True
        )
        events: list[Any] = []
        cancelled = None
        async with asyncio.timeout(TIMEOUT):
            async for event in stream:
                events.append(event)
                if event.type == "response.output_text.delta" and cancelled is None:
                    cancelled = await client.responses.cancel(events[0].response.id)
        after = await client.responses.create(model="any", input="Hi")  # the one slot is free
        kept = await client.responses.retrieve(events[0].response.id)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == kept.status == "cancelled"
    assert events[-1].response.output_text == kept.output_text != ""
    assert after.output_text == " w0 w1 w2 w3"


async def test_connect_continues_three_turns_on_one_socket(tiny_engine: HFEngine) -> None:
    async with running_server(tiny_engine) as url, async_client(url) as client:
        responses = []
        async with client.responses.connect() as connection:
            previous = None
            for text in ("Hello there", "And then?", "Go on"):
                await connection.response.create(
                    model="any",
                    input=text,
                    max_output_tokens=6,
                    store=False,
                    previous_response_id=previous or openai.omit,
                )
                async with asyncio.timeout(TIMEOUT):
                    async for event in connection:
                        if event.type in ("response.completed", "response.incomplete", "error"):
                            break
                assert event.type == "response.incomplete", event
                responses.append(event.response)
                previous = event.response.id
        chat = await client.chat.completions.create(
            model="any",
            messages=[
                user("Hello there"),
                assistant(responses[0].output_text),
                user("And then?"),
                assistant(responses[1].output_text),
                user("Go on"),
            ],
            max_tokens=6,
        )
        with pytest.raises(openai.NotFoundError):  # store: false keeps nothing past the socket
            await client.responses.retrieve(previous or "")
    assert responses[2].output_text == chat.choices[0].message.content
    for before, after in itertools.pairwise(responses):
        assert before.usage is not None and after.usage is not None
        held = before.usage.input_tokens + before.usage.output_tokens
        assert after.usage.input_tokens_details.cached_tokens >= held - 1


async def test_two_lanes_run_at_once_on_one_socket() -> None:
    engine = ScriptedEngine(lambda r: Script([f" w{i}" for i in range(6)], delay_s=0.05))
    async with (
        running_server(engine) as url,
        async_client(url) as client,
        client.responses.connect() as connection,
        AsyncResponsesWebSocketSession(connection, limits=LIMITS) as session,
    ):
        lanes = [session.lane("a"), session.lane("b")]
        for lane in lanes:
            await lane.send({"type": "response.create", "model": "any", "input": "Hi"})
        await wait_until(lambda: len(engine.threads) == 2)  # both rows at once
        async with asyncio.timeout(TIMEOUT):
            finals = [await lane.get_final_response() for lane in lanes]
    assert [f.output_text for f in finals] == [" w0 w1 w2 w3 w4 w5"] * 2
    assert finals[0].id != finals[1].id


async def test_a_response_on_the_socket_cancelled_by_id_ends_and_the_socket_goes_on() -> None:
    engine = ScriptedEngine(slow_when_long)
    async with (
        running_server(engine, max_concurrent=1) as url,
        async_client(url) as client,
        client.responses.connect() as connection,
    ):
        await connection.response.create(model="any", input="Hi", max_output_tokens=LONG)
        events: list[Any] = []
        async with asyncio.timeout(TIMEOUT):
            async for event in connection:
                events.append(event)
                if event.type == "response.output_text.delta" and len(events) == 5:
                    await client.responses.cancel(events[0].response.id)
                if event.type == "response.incomplete":
                    break
            await connection.response.create(model="any", input="Hi")
            async for event in connection:
                if event.type == "response.completed":
                    break
    assert events[-1].response.status == "cancelled"
    assert event.response.output_text == " w0 w1 w2 w3"
    assert not engine.threads

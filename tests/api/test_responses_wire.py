"""The Responses API's wire read raw, without the SDK, against a real uvicorn (web/responses/):
server-sent events and WebSocket events in OpenAI's order with their fields, a response of
another owner (bearer token) told apart from none in no way, refusals that name the field, a
socket closed mid-response that frees its slot, a thousand creates on one socket in bounded
memory, messages over the size limit, and events the mode does not serve."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.typing import Origin
from wschat.server.sessions import stats

from tests.api.test_routes import metric
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server, wait_until

LONG = 1000  # max_output_tokens that asks the scripted engine for a reply slower than any test
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def words(request: Any) -> Script:
    """Four words, one event each (a delay between them); for ``LONG``, minutes of them."""
    n = request.params.max_new_tokens
    return Script([f" w{i}" for i in range(n if n >= LONG else 4)], delay_s=0.02)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def responses_socket(url: str, token: str = "t") -> AsyncIterator[ClientConnection]:
    async with asyncio.timeout(TIMEOUT):
        ws = await websockets.connect(
            url.replace("/v1/chat", "/v1/responses"), additional_headers=auth(token), max_size=None
        )
    try:
        yield ws
    finally:
        async with asyncio.timeout(TIMEOUT):
            await ws.close()


async def next_event(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(TIMEOUT):
        message = await ws.recv()
    assert isinstance(message, str), "the server sent a binary message"
    event: dict[str, Any] = json.loads(message)
    return event


async def next_error(ws: ClientConnection) -> dict[str, Any]:
    """The next ``error`` event, past those of a response that runs."""
    while (event := await next_event(ws))["type"] != "error":
        pass
    return event


async def until_end(ws: ClientConnection) -> list[dict[str, Any]]:
    """The events up to and including a terminal one or an error."""
    events = [await next_event(ws)]
    while events[-1]["type"] not in (*TERMINAL, "error"):
        events.append(await next_event(ws))
    return events


def create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": "any", "input": "Hi", **fields})


def check_text_events(events: list[dict[str, Any]], stream_id: str | None = None) -> None:
    """OpenAI's order, one delta per word, numbered from 0, one item and one response id."""
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    types = [e["type"] for e in events if e["type"] != "response.output_text.delta"]
    assert types == [t for t in TEXT_EVENTS if t != "response.output_text.delta"]
    assert [e["delta"] for e in deltas] == [" w0", " w1", " w2", " w3"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(e.get("stream_id") == stream_id for e in events)
    created, done = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    item = events[-2]["item"]
    assert item["id"] == events[2]["item"]["id"] == deltas[0]["item_id"]
    assert item["status"] == "completed" and item["role"] == "assistant"
    assert item["content"] == [
        {"type": "output_text", "text": " w0 w1 w2 w3", "annotations": [], "logprobs": []}
    ]
    assert done["id"] == created["id"] and done["status"] == "completed"
    assert done["output"] == [item]
    assert done["usage"]["output_tokens"] == 4
    assert done["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


async def test_server_sent_events_come_in_openais_order_with_their_fields() -> None:
    async with (
        running_server(ScriptedEngine(words)) as url,
        httpx.AsyncClient(timeout=TIMEOUT) as http,
    ):
        payload = {"model": "any", "input": "Hi", "stream": True}
        async with http.stream("POST", f"{http_base(url)}/v1/responses", json=payload) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = (await r.aread()).decode()
    blocks = [b for b in raw.split("\n\n") if b]
    events = []
    for block in blocks:
        kind, data = block.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert kind == f"event: {events[-1]['type']}"
    check_text_events(events)


async def test_socket_events_come_in_the_same_order_on_a_named_lane() -> None:
    async with running_server(ScriptedEngine(words)) as url, responses_socket(url) as ws:
        await ws.send(create(stream_id="lane.1"))
        check_text_events(await until_end(ws), "lane.1")
        await ws.send(create())
        check_text_events(await until_end(ws))


async def test_another_owners_response_is_not_found_as_one_that_never_was() -> None:
    tokens = ("alice-token", "bob-token")
    async with (
        running_server(ScriptedEngine(), tokens=tokens) as url,
        httpx.AsyncClient(base_url=http_base(url), timeout=TIMEOUT) as http,
    ):
        made = (
            await http.post(
                "/v1/responses", json={"model": "any", "input": "Hi"}, headers=auth("alice-token")
            )
        ).json()
        answers = {}
        for name, response_id, token in [
            ("theirs", made["id"], "bob-token"),
            ("none", "resp_none", "alice-token"),
        ]:
            got = await http.get(f"/v1/responses/{response_id}", headers=auth(token))
            body = {"model": "any", "input": "Hi", "previous_response_id": response_id}
            went_on = await http.post("/v1/responses", json=body, headers=auth(token))
            async with responses_socket(url, token) as ws:
                await ws.send(create(previous_response_id=response_id, stream_id="s"))
                event = await next_event(ws)
            answers[name] = (
                got.status_code,
                got.json(),
                went_on.status_code,
                went_on.json(),
                event,
            )
        mine = await http.get(f"/v1/responses/{made['id']}", headers=auth("alice-token"))
    assert mine.status_code == 200 and mine.json() == made
    (status, body, went_status, went_body, event) = answers["theirs"]
    shown = {"theirs": made["id"], "none": "resp_none"}
    for name, answer in answers.items():
        replaced = json.loads(json.dumps(answer).replace(shown[name], "ID"))
        assert replaced == json.loads(json.dumps(answers["none"]).replace("resp_none", "ID"))
    assert status == 404 and went_status == 400
    assert went_body["error"]["code"] == "previous_response_not_found"
    assert event == {
        "type": "error",
        "status": 400,
        "error": {
            "message": f"Previous response with id {made['id']!r} not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        },
        "stream_id": "s",
    }


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("tools", [{"type": "web_search"}], "tools[0].type"),
        ("prompt", {"id": "pmpt_1"}, "prompt"),
        ("input", [{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ("background", True, "background"),
    ],
)
async def test_what_is_not_served_is_refused_naming_its_field(
    field: str, value: Any, param: str
) -> None:
    async with (
        running_server(ScriptedEngine()) as url,
        httpx.AsyncClient(timeout=TIMEOUT) as http,
        responses_socket(url) as ws,
    ):
        refused = await http.post(
            f"{http_base(url)}/v1/responses", json={"model": "any", "input": "Hi", field: value}
        )
        await ws.send(create(**{field: value}))
        event = await next_event(ws)
        await ws.send(create())  # the socket goes on
        after = await until_end(ws)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported", param)
    assert event == {"type": "error", "status": 400, **refused.json()}
    assert after[-1]["type"] == "response.completed"


async def test_events_the_mode_does_not_serve_get_an_error_naming_them() -> None:
    async with running_server(ScriptedEngine()) as url, responses_socket(url) as ws:
        await ws.send(
            json.dumps({"type": "response.steer", "previous_response_id": "r", "input": "x"})
        )
        steer = await next_event(ws)
        await ws.send("not json")
        garbled = await next_event(ws)
        await ws.send(create(stream_id="a b"))
        bad_lane = await next_event(ws)
        await ws.send(create())
        after = await until_end(ws)
    assert steer["error"] == {
        "message": "the event type 'response.steer' is not served here; send response.create",
        "type": "invalid_request_error",
        "param": "type",
        "code": "unsupported",
    }
    assert garbled["error"]["message"] == "the request body is not JSON"
    assert bad_lane["error"]["code"] == "invalid_stream_id" and bad_lane["stream_id"] == "a b"
    assert after[-1]["type"] == "response.completed"


async def test_a_message_over_the_size_limit_is_refused_and_the_socket_goes_on() -> None:
    async with running_server(ScriptedEngine(), max_frame_bytes=4096) as url:
        async with responses_socket(url) as ws:
            message = create(input="x" * 5000)
            await ws.send(message)
            over = await next_event(ws)
            await ws.send(create())
            after = await until_end(ws)
        async with responses_socket(url) as ws:  # far over: the transport closes the socket
            await ws.send(create(input="x" * 20_000))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await next_event(ws)
    assert over == {
        "type": "error",
        "status": 413,
        "error": {
            "message": f"a message is at most 4096 bytes; this one is {len(message)}",
            "type": "invalid_request_error",
            "param": None,
            "code": "too_large",
        },
    }
    assert after[-1]["type"] == "response.completed"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_a_socket_closed_mid_response_frees_its_slot() -> None:
    engine = ScriptedEngine(words)
    async with running_server(engine, max_concurrent=1) as url:
        async with responses_socket(url) as ws:
            await ws.send(create(max_output_tokens=LONG))
            while (await next_event(ws))["type"] != "response.output_text.delta":
                pass
        await wait_until(lambda: not engine.threads)  # the engine stopped within a step
        async with responses_socket(url) as ws:  # the one slot is free
            await ws.send(create())
            after = await until_end(ws)
        assert await metric(http_base(url), "wschat_cancellations_total") == 1
        assert await metric(http_base(url), "wschat_generations_running") == 0
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            scraped = (await http.get(f"{http_base(url)}/metrics")).text
    assert after[-1]["type"] == "response.completed"
    assert 'wschat_generations_total{api="responses_websocket"} 2.0' in scraped


def held(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    """The traces but tracemalloc's own (the snapshot taken before) and coverage.py's: under the
    coverage run (.ci/run) it keeps a tracer for every thread ever started, and the scripted
    engine starts one per generation (1.3 kB each)."""
    ignored = (tracemalloc.__file__, "*/coverage/*")
    return snapshot.filter_traces([tracemalloc.Filter(False, name) for name in ignored])


async def test_a_thousand_creates_on_one_socket_hold_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Growth per create, not a fixed cost: what the second of two windows of creates adds. A
    cost paid once (a cache, a window filling) lands in the first window; a leak grows both."""

    async def creates(ws: ClientConnection, n: int) -> str:
        for k in range(n):
            await ws.send(create(max_output_tokens=2, stream_id=f"lane{k % 4}"))
            events = await until_end(ws)
            assert events[-1]["type"] == "response.incomplete", events[-1]
        return str(events[-1]["response"]["id"])

    def settled() -> tracemalloc.Snapshot:
        engine.requests.clear()  # the fake's record of every request, not the server's
        gc.collect()
        return held(tracemalloc.take_snapshot())

    # The server's recent TTFT samples (capped at 10,000 and bounded in tests/sessions/
    # test_stats.py) capped below the warm-up's count, so that window is full before measuring.
    monkeypatch.setattr(stats, "_MAX_TTFT_SAMPLES", 50)
    engine = ScriptedEngine()
    async with (
        running_server(engine, responses_kept=10, frames_per_second=0) as url,
        responses_socket(url) as ws,
    ):
        first = await creates(ws, 1)
        await creates(ws, 99)  # the store, the lanes and that window full
        tracemalloc.start()
        try:
            await creates(ws, 450)
            before = settled()
            last = await creates(ws, 450)
            after = settled()
        finally:
            tracemalloc.stop()
        headers = auth("t")
        async with httpx.AsyncClient(base_url=http_base(url), headers=headers) as http:
            oldest = await http.get(f"/v1/responses/{first}", timeout=TIMEOUT)
            newest = await http.get(f"/v1/responses/{last}", timeout=TIMEOUT)
    assert oldest.status_code == 404  # past --responses-kept, the least recently used went
    assert newest.status_code == 200
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    # 64 kB over 450 creates: a leak of 146 bytes a create fails it; the asyncio timers and
    # callbacks pending at a snapshot varied the figure from 13 to 32 kB
    assert grown < 64 << 10, f"{grown} bytes more after the second 450 creates"


async def test_the_socket_takes_the_apis_bearer_token_and_origin_rules() -> None:
    allowed = Origin("https://app.example")
    engine = ScriptedEngine()
    async with running_server(engine, tokens=("t",), allowed_origins=(allowed,)) as url:
        path = url.replace("/v1/chat", "/v1/responses")
        refusals = []
        for headers, origin in [
            ({}, None),
            (auth("x"), None),
            (auth("t"), Origin("https://evil.example")),
        ]:
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with asyncio.timeout(TIMEOUT):
                    await websockets.connect(path, additional_headers=headers, origin=origin)
            refusals.append(refused.value.response.status_code)
        async with asyncio.timeout(TIMEOUT):
            ws = await websockets.connect(path, additional_headers=auth("t"), origin=allowed)
        async with ws:
            await ws.send(create())
            events = await until_end(ws)
    assert refusals == [401, 401, 403]
    assert events[-1]["type"] == "response.completed"


async def test_a_full_queue_is_an_overloaded_error_event_on_its_lane() -> None:
    engine = ScriptedEngine(words)
    async with (
        running_server(engine, max_concurrent=1, max_queue=0) as url,
        responses_socket(url) as ws,
    ):
        await ws.send(create(stream_id="a", max_output_tokens=LONG))
        await wait_until(lambda: engine.threads)
        await ws.send(create(stream_id="b"))
        refused = await next_error(ws)
    assert refused == {
        "type": "error",
        "status": 429,
        "error": {
            "message": "the server is at capacity (0 prompts already waiting)",
            "type": "rate_limit_error",
            "param": None,
            "code": "overloaded",
        },
        "stream_id": "b",
    }


async def test_creates_waiting_on_a_socket_are_bounded_in_number_and_bytes() -> None:
    engine = ScriptedEngine(words)
    async with (
        running_server(engine, max_frame_bytes=4096) as url,
        responses_socket(url) as ws,
    ):
        await ws.send(create(max_output_tokens=LONG))  # runs, and the lane's next ones wait
        await wait_until(lambda: engine.threads)
        await ws.send(create(input="x" * 2500))
        await ws.send(create(input="y" * 2500))  # the two together are over 4096 bytes
        over_bytes = await next_error(ws)
        for _ in range(15):  # 16 waiting in all
            await ws.send(create())
        await ws.send(create())
        over_count = await next_error(ws)
    message = "at most 16 creates, of 4096 bytes in all, may wait on a socket for their lanes"
    for refused in (over_bytes, over_count):
        assert refused["error"]["message"] == message
        assert (refused["status"], refused["error"]["code"]) == (429, "overloaded")
    await wait_until(lambda: not engine.threads)  # the socket's end cancelled what ran


async def test_a_response_beside_another_on_a_socket_takes_a_connection_place() -> None:
    engine = ScriptedEngine(words)
    async with (
        running_server(engine, max_connections_per_client=1) as url,
        responses_socket(url) as ws,
    ):
        await ws.send(create(stream_id="a", max_output_tokens=LONG))  # the socket's own place
        await wait_until(lambda: engine.threads)
        await ws.send(create(stream_id="b"))
        refused = await next_error(ws)
    beside = "a response beside another on a socket counts as a connection until it ends"
    assert refused["error"]["message"] == f"too many connections from this address (1): {beside}"
    assert (refused["status"], refused["stream_id"]) == (429, "b")


async def test_the_last_responses_a_socket_keeps_hold_what_one_session_may() -> None:
    engine = ScriptedEngine()
    async with (
        running_server(engine, max_session_image_bytes=1000, max_frame_bytes=4096) as url,
        responses_socket(url) as ws,
    ):
        ids = []
        for lane in ("a", "b", "c"):
            await ws.send(create(stream_id=lane, store=False))
            ids.append((await until_end(ws))[-1]["response"]["id"])
        await ws.send(create(stream_id="a", store=False, previous_response_id=ids[0]))
        oldest = await next_event(ws)
        await ws.send(create(stream_id="a", store=False, previous_response_id=ids[2]))
        newest = await until_end(ws)
    assert oldest["error"]["code"] == "previous_response_not_found"
    assert newest[-1]["type"] == "response.completed"
    assert newest[-1]["response"]["previous_response_id"] == ids[2]

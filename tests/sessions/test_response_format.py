"""``params.response_format`` and ``params.logprobs`` on the WebSocket, through a real server and a
raw msgpack client (PROTOCOL.md sections 5 to 7): the format reaches the engine, prepared before
the prompt is accepted; a refused one is an ``error`` with the prompt's id and changes nothing;
a session default set by ``configure`` applies, and ``{type: "text"}`` turns it off; logprobs
come in each ``token`` frame's flat lists, and in none when not asked."""

from __future__ import annotations

from typing import Any

from wschat.protocol import TokenLogprobs
from wschat.server.engine.grammar import ResponseFormat

from tests.fakes.scripted import REFUSED_KEY, REFUSED_REASON, ScriptedEngine
from tests.support import raw_peer, running_server

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def json_schema(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": strict}}


def prompt(frame_id: str, **params: Any) -> dict[str, Any]:
    return {"type": "prompt", "id": frame_id, "text": "Hi", "params": params}


async def test_a_prompts_response_format_is_prepared_then_reaches_the_engine() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(prompt("p1", response_format=json_schema(SCHEMA)))
        frames = await peer.recv_until("done")
    assert frames[-1]["reason"] == "stop"
    expected = ResponseFormat(SCHEMA, strict=True)
    assert engine.prepared == [expected]
    assert engine.requests[0].params.response_format == expected


async def test_a_refused_schema_is_invalid_params_with_the_reason_and_changes_nothing() -> None:
    engine = ScriptedEngine()
    refused = json_schema({**SCHEMA, REFUSED_KEY: True})
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(prompt("p1", response_format=refused))
        (error,) = await peer.recv_until("error")
        assert error == {
            "type": "error",
            "id": "p1",
            "code": "invalid_params",
            "message": f"response_format: the schema cannot be enforced: {REFUSED_REASON}",
        }
        await peer.send({"type": "regenerate", "id": "r1", "params": {"response_format": refused}})
        assert (await peer.recv_until("error"))[-1]["code"] == "invalid_params"
        await peer.send(prompt("p1"))  # its id was not used: the session goes on
        frames = await peer.recv_until("done")
    assert frames[0]["type"] == "start" and frames[-1]["reason"] == "stop"
    assert engine.requests[0].params.response_format is None
    assert len(engine.requests) == 1


async def test_a_schema_past_a_cap_is_refused_as_the_frame_is_read() -> None:
    engine = ScriptedEngine()
    deep: dict[str, Any] = {}
    for _ in range(24):  # 25 maps: one past the cap
        deep = {"items": deep}
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(prompt("p1", response_format=json_schema(deep)))
        (error,) = await peer.recv_until("error")
        await peer.send(prompt("p2", response_format={"type": "yaml"}))
        (other,) = await peer.recv_until("error")
    assert (error["id"], error["code"]) == ("p1", "invalid_params")
    assert error["message"] == "response_format.json_schema.schema is nested more than 24 deep"
    assert other["message"] == "response_format.type must be one of text, json_object, json_schema"
    assert engine.prepared == [] and engine.requests == []


async def test_a_configured_default_format_applies_and_type_text_turns_it_off() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(
            {"type": "configure", "params": {"response_format": {"type": "json_object"}}}
        )
        await peer.recv_until("configured")
        await peer.send(prompt("p1"))
        await peer.recv_until("done")
        await peer.send(prompt("p2", response_format={"type": "text"}))
        await peer.recv_until("done")
    formats = [request.params.response_format for request in engine.requests]
    assert formats == [ResponseFormat(), None]


async def test_logprobs_come_in_each_token_frame_and_in_none_when_not_asked() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        await peer.send(prompt("p1", logprobs=2, max_new_tokens=3))
        asked = [f for f in await peer.recv_until("done") if f["type"] == "token"]
        await peer.send(prompt("p2", max_new_tokens=3))
        plain = [f for f in await peer.recv_until("done") if f["type"] == "token"]
    assert all("logprobs" not in frame for frame in plain)
    read = [TokenLogprobs.from_wire(frame["logprobs"]) for frame in asked]
    ids = [i for part in read for i in part.ids]
    assert ids == [1000, 1001, 1002]
    assert [v for part in read for v in part.logprobs] == [-0.5, -0.5, -0.5]
    assert all(part.top == 2 for part in read)
    assert [v for part in read for v in part.top_logprobs] == [-1.0, -2.0] * 3
    assert "".join(t for part in read for t in part.tokens) == "".join(f["text"] for f in asked)
    assert [b for part in read for b in part.token_bytes] == [b" w0", b" w1", b" w2"]

"""Tool calls in front of an engine over HTTP (``--engine openai``; engine/tool_grammar.py
``held_to_tools``): a forced call is sent as its calls' JSON schema in each engine's own field,
for the engine to enforce, and the call it writes comes back as ``tool_calls``; an ``auto``
reply is sent no grammar (the engines take JSON schemas only) and is read as it comes. A call
whose arguments do not match its tool's schema (an engine that ignored the schema, or was sent
none) is an engine failure: ``internal``, the exchange not kept, the session goes on."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from wschat.server.engine.openai.dialect import LLAMA_CPP, SGLANG, VLLM

from tests.api.support import async_client, user
from tests.fakes.openai_engine import Answer, misbehaving_engine, reply
from tests.sessions.test_tool_loop import CALL, WEATHER
from tests.support import RawPeer, raw_peer, running_server

from .connected import connected

TOOL: Any = {"type": "function", "function": WEATHER}
# a call whose arguments fail get_weather's schema: its city is a number
BAD_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": 7}}]}'
BAD_ARGUMENTS = (
    "the engine called get_weather with arguments that do not match its parameters:"
    " 7 is not of type 'string' (at city)"
)


def calls(path: str, body: dict[str, Any]) -> Answer:
    dialect = VLLM if path.startswith("/v1/") else LLAMA_CPP
    return reply(dialect, [(CALL, [1000 + n for n in range(20)])])


def sent_schema(dialect: str, body: dict[str, Any]) -> Any:
    """The JSON schema a text request carries, in the engine's own field."""
    if dialect == LLAMA_CPP:
        return body["json_schema"]
    if dialect == SGLANG:
        return json.loads(body["json_schema"])
    return body["response_format"]["json_schema"]["schema"]


@pytest.mark.parametrize("dialect", [VLLM, LLAMA_CPP, SGLANG])
async def test_a_forced_call_is_sent_as_its_schema_and_comes_back_as_tool_calls(
    dialect: str,
) -> None:
    async with (
        misbehaving_engine(dialect, calls) as fake,
        connected(fake, dialect) as remote,
        running_server(remote) as url,
        async_client(url) as client,
    ):
        answer = await client.chat.completions.create(
            model="m", messages=[user("Weather in Paris?")], tools=[TOOL], tool_choice="required"
        )
        body = fake.served[-1].body
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    schema = sent_schema(dialect, body)
    assert schema["required"] == ["tool_calls"]
    item = schema["properties"]["tool_calls"]["items"]
    assert item["properties"]["name"] == {"const": "get_weather"}
    assert item["properties"]["arguments"] == WEATHER["parameters"]


async def test_an_auto_reply_is_sent_no_grammar_and_read_as_it_comes() -> None:
    async with (
        misbehaving_engine(VLLM, calls) as fake,
        connected(fake, VLLM) as remote,
        running_server(remote) as url,
        async_client(url) as client,
    ):
        answer = await client.chat.completions.create(
            model="m", messages=[user("Weather in Paris?")], tools=[TOOL]
        )
        body = fake.served[-1].body
    assert "response_format" not in body
    assert answer.choices[0].finish_reason == "tool_calls"


def bad_call_then_text() -> Any:
    """A script whose first reply calls get_weather with bad arguments and every later one
    says "Paris."."""
    served = 0

    def script(path: str, body: dict[str, Any]) -> Answer:
        nonlocal served
        served += 1
        if served == 1:
            return reply(VLLM, [(BAD_CALL, [1000 + n for n in range(20)])])
        return reply(VLLM, [("Paris.", [2000])])

    return script


async def ask(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done")


@pytest.mark.parametrize("choice", ["required", "auto"])
async def test_a_call_whose_arguments_fail_the_schema_is_internal_and_not_kept(
    choice: str,
) -> None:
    async with (
        misbehaving_engine(VLLM, bad_call_then_text()) as fake,
        connected(fake, VLLM) as remote,
        running_server(remote) as url,
        raw_peer(url) as (peer, _),
    ):
        frames = await ask(peer, "a", "Weather?", tools=[WEATHER], tool_choice=choice)
        after = await ask(peer, "b", "Capital of France?")
        prompt = fake.served[-1].body["prompt"]
    assert [f["type"] for f in frames] == ["start", "error", "done"], json.dumps(frames)
    assert (frames[1]["code"], frames[1]["message"]) == ("internal", BAD_ARGUMENTS)
    assert (frames[2]["reason"], frames[2]["turn"]) == ("error", None)
    # the next prompt follows no exchange: the bad call's ids are not in its prompt
    assert (after[-1]["reason"], after[-1]["text"], after[-1]["turn"]) == ("stop", "Paris.", 1)
    assert 1000 not in prompt


async def test_a_call_whose_arguments_fail_the_schema_is_an_api_error_then_served_again() -> None:
    async with (
        misbehaving_engine(VLLM, bad_call_then_text()) as fake,
        connected(fake, VLLM) as remote,
        running_server(remote) as url,
        async_client(url) as client,
    ):
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(
                model="m", messages=[user("Weather?")], tools=[TOOL], tool_choice="required"
            )
        answer = await client.chat.completions.create(model="m", messages=[user("Capital?")])
    assert failed.value.body == {
        "message": BAD_ARGUMENTS,
        "type": "server_error",
        "param": None,
        "code": "internal",
    }
    assert (answer.choices[0].finish_reason, answer.choices[0].message.content) == (
        "stop",
        "Paris.",
    )

"""Tool calls in front of an engine over HTTP (``--engine openai``; engine/tool_grammar.py
``held_to_tools``): a forced call is sent as its calls' JSON schema in each engine's own field,
for the engine to enforce, and the call it writes comes back as ``tool_calls``; an ``auto``
reply is sent no grammar (the engines take JSON schemas only) and is read as it comes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from wschat.server.engine.openai.dialect import LLAMA_CPP, SGLANG, VLLM

from tests.api.support import async_client, user
from tests.fakes.openai_engine import Answer, misbehaving_engine, reply
from tests.sessions.test_tool_loop import CALL, WEATHER
from tests.support import running_server

from .connected import connected

TOOL: Any = {"type": "function", "function": WEATHER}


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

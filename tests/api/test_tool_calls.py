"""Tool calls on the chat completions API (web/openai_api/tool_fields.py, reply.py) through the
official ``openai`` SDK against a real server on the scripted engine: the whole loop (call,
result, answer) whole and streamed in OpenAI's shapes, a call the API gave rendered again as the
ids it was generated as, and each bad input a 400 naming its field."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from tests.sessions.test_tool_loop import ANSWER, WEATHER, tool_engine
from tests.support import running_server

from .support import async_client, user

TOOL: ChatCompletionToolParam = {"type": "function", "function": WEATHER}  # type: ignore[typeddict-item]
FORCED: dict[str, Any] = {"tools": [TOOL], "tool_choice": "required"}


async def test_a_full_tool_loop_with_the_sdk_calls_then_answers_from_the_result() -> None:
    engine = tool_engine()
    async with running_server(engine) as url, async_client(url) as client:
        messages: list[ChatCompletionMessageParam] = [user("Weather in Paris?")]
        first = await client.chat.completions.create(model="m", messages=messages, **FORCED)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'})
        second = await client.chat.completions.create(
            model="m", messages=messages, tools=[TOOL], tool_choice="auto"
        )
        assert second.choices[0].finish_reason == "stop"
        assert second.choices[0].message.content == ANSWER
        assert second.choices[0].message.tool_calls is None
        # the call came back as the ids it was generated as: the first prompt is a prefix
        before, after = (r.prompt_ids for r in engine.requests)
        assert after[: len(before)] == before


async def test_a_streamed_call_comes_as_a_tool_calls_delta_then_finish_tool_calls() -> None:
    async with running_server(tool_engine()) as url, async_client(url) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[user("Weather in Paris?")], stream=True, **FORCED
        )
        chunks = [chunk async for chunk in stream]
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert all(not d.content for d in deltas)
        (calls,) = [d.tool_calls for d in deltas if d.tool_calls]
        assert [(c.index, c.type, c.function and c.function.name) for c in calls] == [
            (0, "function", "get_weather")
        ]
        assert calls[0].id and calls[0].id.startswith("call_")
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_the_answer_to_results_streams_as_text() -> None:
    async with running_server(tool_engine()) as url, async_client(url) as client:
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
        call["function"]["arguments"] = '{"city": "Paris"}'  # type: ignore[index]
        messages: list[Any] = [
            user("Weather in Paris?"),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        stream = await client.chat.completions.create(
            model="m", messages=messages, tools=[TOOL], stream=True
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == ANSWER
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def nested(depth: int) -> dict[str, Any]:
    """An object schema ``depth`` objects deep."""
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


CALL_1 = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": "{}"},
}


@pytest.mark.parametrize(
    ("fields", "messages", "param", "message"),
    [
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            [user("hi")],
            None,
            "tool_choice names 'nope', which tools does not offer",
        ),
        (
            {"tools": [TOOL]},
            [
                user("hi"),
                {"role": "assistant", "content": None, "tool_calls": [CALL_1]},
                {"role": "tool", "tool_call_id": "call_9", "content": "x"},
            ],
            None,
            "no tool call 'call_9' awaits a result",
        ),
        (
            {"tools": [TOOL]},
            [
                user("hi"),
                {"role": "assistant", "content": None, "tool_calls": [CALL_1]},
                user("and?"),
            ],
            None,
            "a reply's tool calls must be followed by their results",
        ),
        (
            {"tools": [TOOL]},
            [user("hi"), {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
            None,
            "tool results must follow a reply that called tools",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "deep", "parameters": nested(30)},
                    }
                ]
            },
            [user("hi")],
            "tools",
            "tools is nested more than 24 deep",
        ),
    ],
)
async def test_tool_fields_and_messages_that_do_not_hold_are_400_naming_why(
    fields: dict[str, Any], messages: list[Any], param: str | None, message: str
) -> None:
    async with running_server(tool_engine()) as url, async_client(url) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(model="m", messages=messages, **fields)
        error = raised.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["message"], error["param"]) == (
            "invalid_params",
            message,
            param,
        )


async def test_the_deprecated_functions_are_refused_as_unsupported() -> None:
    async with running_server(tool_engine()) as url, async_client(url) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(
                model="m", messages=[user("hi")], extra_body={"functions": [WEATHER]}
            )
        error = raised.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"]) == ("unsupported", "functions")

"""Tool calls on the embedded Gemma 3 270M (a base model that was never taught a tool syntax)
through a real server, the call forced with ``tool_choice``: the official ``openai`` SDK runs the
whole loop (call, result, answer), whole and streamed; ``openai-agents`` runs its own; and the
bundled client's ``run`` does it over the WebSocket. The grammar makes every forced call a valid
one: a listed function, arguments that match its schema."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from wschat.client import connect
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.loader import LoadedModel

from tests.api.support import async_client, user
from tests.support import TIMEOUT, running_server

pytestmark = pytest.mark.real_model

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOOL: Any = {"type": "function", "function": WEATHER}
QUESTION = "What is the weather like in Paris today?"


@pytest.fixture
async def url(embedded: LoadedModel) -> AsyncIterator[str]:
    engine = BatchedEngine(embedded)
    try:
        async with running_server(engine) as served:
            yield served
    finally:
        await engine.aclose()


def checked_call(arguments: str) -> str:
    """The call's city: its arguments parse and match the schema (one string, at most 40)."""
    parsed = json.loads(arguments)
    assert set(parsed) == {"city"} and isinstance(parsed["city"], str)
    assert len(parsed["city"]) <= 40
    return str(parsed["city"])


@pytest.mark.parametrize("stream", [False, True])
async def test_the_sdk_runs_a_forced_call_its_result_and_the_answer(url: str, stream: bool) -> None:
    async with async_client(url) as client:
        messages: list[Any] = [user(QUESTION)]
        ask: dict[str, Any] = {
            "model": "m",
            "tools": [TOOL],
            "parallel_tool_calls": False,  # the base model would call it again and again
            "max_completion_tokens": 64,
        }
        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    messages=messages, tool_choice="required", stream=True, **ask
                )
            ]
            (calls,) = [
                c.choices[0].delta.tool_calls
                for c in chunks
                if c.choices and c.choices[0].delta.tool_calls
            ]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            call_id, name, arguments = (
                calls[0].id,
                calls[0].function.name,
                calls[0].function.arguments,
            )
        else:
            reply = await client.chat.completions.create(
                messages=messages, tool_choice="required", **ask
            )
            finish = reply.choices[0].finish_reason
            (call,) = reply.choices[0].message.tool_calls or []
            call_id, name, arguments = call.id, call.function.name, call.function.arguments
        assert finish == "tool_calls" and name == "get_weather"
        checked_call(arguments or "")
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 24 C."})
        answer = await client.chat.completions.create(messages=messages, tool_choice="none", **ask)
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        # the call came back as the ids it was generated as: its prompt was reused
        assert answer.usage.prompt_tokens_details.cached_tokens > 0


async def test_openai_agents_runs_its_loop_with_the_call_forced(url: str) -> None:
    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"Sunny, 24 C in {city}."

    async with async_client(url) as client:
        agent = Agent(
            name="weather",
            instructions="Use the weather tool.",
            tools=[get_weather],
            model=OpenAIChatCompletionsModel(model="m", openai_client=client),
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, max_tokens=64
            ),
            tool_use_behavior="stop_on_first_tool",
        )
        result = await Runner.run(agent, QUESTION, max_turns=3)
    assert len(asked) == 1 and asked[0]
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs == [f"Sunny, 24 C in {asked[0]}."] == [result.final_output]


async def test_the_bundled_client_runs_the_loop_over_the_websocket(url: str) -> None:
    async with connect(url, timeout=TIMEOUT) as chat:
        once: dict[str, Any] = {"tools": [WEATHER], "parallel_tool_calls": False}
        first = chat.prompt(QUESTION, tool_choice="required", max_new_tokens=64, **once)
        done = await first.wait(TIMEOUT)
        assert done.reason.value == "tool_calls" and done.turn == 1
        (call,) = first.calls
        checked_call(call.arguments)
        # the answer: the same tools offered (the same prompt), no call this time
        answer = chat.tool_results(
            {call.call_id: "Sunny, 24 C."}, tool_choice="none", max_new_tokens=32, **once
        )
        done = await answer.wait(TIMEOUT)
        assert done.reason.value in ("stop", "length") and done.turn == 1 and done.text
        assert done.usage.cached_tokens > 0  # the call's prompt and reply were reused

"""Function tools on the Responses API (web/responses/request.py, shapes.py), read as the chat
API reads its own (openai_api/tool_fields.py) and run on the same session path: through the
official SDK over HTTP and over the WebSocket mode, a call then its output continued by
``previous_response_id`` or sent back whole, the call's events in OpenAI's order; and
``openai-agents`` running its tool loop over the Responses WebSocket transport."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import Agent, ModelSettings, function_tool, set_tracing_disabled
from agents.responses_websocket_session import responses_websocket_session

from tests.api.test_routes import metric
from tests.sessions.test_tool_loop import ANSWER, WEATHER, tool_engine
from tests.support import TIMEOUT, http_base, running_server

from .support import async_client

TOOL: Any = {"type": "function", **WEATHER, "strict": False}
FORCED: dict[str, Any] = {"tools": [TOOL], "tool_choice": "required"}
CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


async def test_a_call_then_its_output_continued_by_previous_response_id() -> None:
    engine = tool_engine()
    async with running_server(engine) as url, async_client(url) as client:
        first = await client.responses.create(model="m", input="Weather in Paris?", **FORCED)
        (call,) = first.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert first.status == "completed" and first.output_text == ""
        output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = await client.responses.create(
            model="m", input=[output], previous_response_id=first.id, tools=[TOOL]
        )
    assert second.output_text == ANSWER
    # the call renders as the ids it was generated as: the first prompt is the second's prefix
    before, after = (r.prompt_ids for r in engine.requests)
    assert after[: len(before)] == before
    assert second.usage is not None and second.usage.input_tokens > len(before)


async def test_a_call_and_its_output_sent_back_whole_are_answered() -> None:
    async with running_server(tool_engine()) as url, async_client(url) as client:
        first = await client.responses.create(
            model="m", input="Weather in Paris?", store=False, **FORCED
        )
        (call,) = first.output
        items: list[Any] = [
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ]
        second = await client.responses.create(model="m", input=items, tools=[TOOL])
    assert second.output_text == ANSWER


async def test_a_call_streams_its_events_on_the_socket_then_the_answer() -> None:
    async with (
        running_server(tool_engine()) as url,
        async_client(url) as client,
        client.responses.connect() as connection,
    ):
        await connection.response.create(model="m", input="Weather in Paris?", **FORCED)
        events = []
        async with asyncio.timeout(TIMEOUT):
            async for event in connection:
                events.append(event)
                if event.type == "response.completed":
                    break
            (call,) = events[-1].response.output
            output: Any = {"type": "function_call_output", "call_id": call.call_id}
            output["output"] = "sunny"
            await connection.response.create(
                model="m", input=[output], previous_response_id=events[-1].response.id
            )
            async for event in connection:
                if event.type == "response.completed":
                    break
    assert [e.type for e in events] == CALL_EVENTS
    added, delta, done = events[2], events[3], events[4]
    assert added.item.type == "function_call" and added.item.arguments == ""
    assert delta.delta == done.arguments == call.arguments
    assert delta.item_id == done.item_id == added.item.id == call.id
    assert event.response.output_text == ANSWER


async def test_openai_agents_runs_its_tool_loop_over_the_responses_websocket() -> None:
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    set_tracing_disabled(True)
    engine = tool_engine()
    async with running_server(engine) as url:
        base = http_base(url) + "/v1"
        async with responses_websocket_session(api_key="-", base_url=base) as session:
            agent = Agent(
                name="weather",
                instructions="Answer with the weather tool.",
                tools=[get_weather],
                model="m",
                model_settings=ModelSettings(tool_choice="required"),
            )
            result = await session.run(agent, "Weather in Paris?", max_turns=4)
        over_the_socket = await metric(
            http_base(url), 'wschat_generations_total{api="responses_websocket"}'
        )
    assert over_the_socket == 2  # the call, then the answer
    assert result.final_output == ANSWER
    assert asked == ["Paris"]
    last = engine.decode(engine.requests[-1].prompt_ids)
    assert '{"tool_results": [{"name": "get_weather", "content": "sunny in Paris"}]}' in last

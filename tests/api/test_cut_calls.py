"""A reply's calls cut by its budget on the HTTP APIs (PROTOCOL.md section 7 "Tool calls", note
23): the calls whole before the cut come as calls, the cut call is no call and never text: the
chat API's ``tool_calls`` with ``finish_reason: "length"`` (whole and streamed), the Responses
API's ``function_call`` items in an ``incomplete`` response. The same cut on the WebSocket, and
a reply of call after call: tests/sessions/test_cut_calls.py."""

from __future__ import annotations

import json
from typing import Any

from tests.sessions.test_cut_calls import cut_engine
from tests.sessions.test_tool_loop import WEATHER
from tests.support import running_server

from .support import async_client, user

CHAT_TOOL: Any = {"type": "function", "function": WEATHER}
RESPONSES_TOOL: Any = {"type": "function", **WEATHER, "strict": False}


async def test_a_cut_call_on_the_chat_api_is_left_out_and_the_finish_is_length() -> None:
    async with running_server(cut_engine()) as url, async_client(url) as client:
        answer = await client.chat.completions.create(
            model="m", messages=[user("Paris?")], tools=[CHAT_TOOL], tool_choice="required"
        )
        stream = await client.chat.completions.create(
            model="m",
            messages=[user("Paris?")],
            tools=[CHAT_TOOL],
            tool_choice="required",
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    choice = answer.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("length", None)
    (call,) = choice.message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not "".join(d.content or "" for d in deltas)
    (calls,) = [d.tool_calls for d in deltas if d.tool_calls]
    assert [(c.index, c.function and c.function.arguments) for c in calls] == [
        (0, '{"city": "Paris"}')
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_a_cut_call_on_the_responses_api_is_left_out_of_an_incomplete_response() -> None:
    async with running_server(cut_engine()) as url, async_client(url) as client:
        response = await client.responses.create(
            model="m", input="Paris?", tools=[RESPONSES_TOOL], tool_choice="required"
        )
    assert response.status == "incomplete" and response.output_text == ""
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    (call,) = response.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}

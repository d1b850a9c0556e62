"""Tool calls in front of the real llama.cpp child (``--engine openai`` on it, as ``--engine
llamacpp`` serves): the embedded base model, held to a forced call's JSON schema by llama.cpp,
writes the same call again and again; with parallel calls allowed the reply ends after the last
call that leaves room for another (engine tool_calls.py ``CallReader.full``), as in process, and
its calls are answered. A call cut by a budget too small for it is neither a call nor text, on
the WebSocket, the chat API and the Responses API (PROTOCOL.md section 7 "Tool calls")."""

from __future__ import annotations

from typing import Any

import openai
from wschat.client import connect
from wschat.server.engine.openai import OpenAIEngine

from tests.e2e.test_real_model_tools import QUESTION, TOOL, WEATHER, checked_call
from tests.support import http_base, running_server

# a 500-token prompt prefilled by llama.cpp on one thread of a busy machine
WAIT_S = 240.0
RESPONSES_TOOL: Any = {"type": "function", **WEATHER, "strict": False}
NAMED: Any = {"type": "function", "name": "get_weather"}


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{http_base(url)}/v1", api_key="-", timeout=WAIT_S, max_retries=0
    )


async def test_a_forced_call_with_parallel_calls_ends_after_its_calls(
    openai_engine: OpenAIEngine,
) -> None:
    async with running_server(openai_engine) as url:
        async with connect(url, timeout=WAIT_S) as chat:
            called = chat.prompt(
                QUESTION, tools=[WEATHER], tool_choice="required", max_new_tokens=80
            )
            done = await called.wait(WAIT_S)
            assert (done.reason.value, done.text, done.turn) == ("tool_calls", "", 1)
            assert called.tokens == [] and called.calls
            for call in called.calls:
                checked_call(call.arguments)
            answer = chat.tool_results(
                {call.call_id: "Sunny, 24 C." for call in called.calls},
                tools=[WEATHER],
                tool_choice="none",
                max_new_tokens=8,
            )
            done = await answer.wait(WAIT_S)
            assert done.reason.value in ("stop", "length") and done.turn == 1
        async with sdk(url) as client:
            reply = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": QUESTION}],
                tools=[TOOL],
                tool_choice="required",
                max_completion_tokens=80,
            )
    choice = reply.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    assert choice.message.tool_calls
    for made in choice.message.tool_calls:
        assert made.function.name == "get_weather"
        checked_call(made.function.arguments)


async def test_a_call_cut_by_its_budget_is_no_text_on_any_door(
    openai_engine: OpenAIEngine,
) -> None:
    forced: dict[str, Any] = {
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
    }
    async with running_server(openai_engine) as url:
        async with connect(url, timeout=WAIT_S) as chat:
            cut = chat.prompt(
                QUESTION, tools=[WEATHER], tool_choice={"name": "get_weather"}, max_new_tokens=16
            )
            done = await cut.wait(WAIT_S)
            assert (done.reason.value, done.text, cut.tokens, cut.calls) == ("length", "", [], [])
            assert done.usage.completion_tokens == 16
        async with sdk(url) as client:
            reply = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": QUESTION}],
                tools=[TOOL],
                max_completion_tokens=16,
                **forced,
            )
            response = await client.responses.create(
                model="m",
                input=QUESTION,
                tools=[RESPONSES_TOOL],
                tool_choice=NAMED,
                max_output_tokens=16,
            )
    choice = reply.choices[0]
    # no call and no text: an empty content, as an empty text reply's
    assert (choice.finish_reason, choice.message.content) == ("length", "")
    assert choice.message.tool_calls is None
    # no call: its one message, empty (web/responses/shapes.py)
    assert (response.status, response.output_text) == ("incomplete", "")
    assert [item.type for item in response.output] == ["message"]
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"

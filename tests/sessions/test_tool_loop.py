"""The WebSocket tool loop (PROTOCOL.md section 7 "Tool calls", section 5 ``tool_results``)
against the scripted engine: over a real server through the bundled client's ``run`` and a raw
msgpack peer, each refusal in its order with its exact message, rewind dropping the exchange with
its tool turns, and a stored session's calls awaiting results after a resume elsewhere."""

from __future__ import annotations

import json
from typing import Any

import pytest
from wschat.client import CallRequest, InvalidParamsError, connect
from wschat.protocol import (
    Configure,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    GenerationParams,
    Prompt,
    ProtocolError,
    Rewind,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolResults,
    ToolSpec,
)
from wschat.server.engine import GenerationRequest
from wschat.server.sessions.inputs import TakenOver
from wschat.server.sessions.snapshot import export_state, import_state, pack, unpack

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, RawPeer, raw_peer, running_server, wait_until

from .test_session import Recorder, done_of, make_session

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
# a call whose arguments break get_weather's schema: its city is a number
BAD_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": 7}}]}'
ANSWER = " Sunny in Paris."
TOOLS = GenerationParams(tools=(ToolSpec(**WEATHER),))


def tool_engine() -> ScriptedEngine:
    """Calls get_weather when a user asks; answers once the results are the last turn."""
    engine = ScriptedEngine()

    def script(request: GenerationRequest) -> Script:
        last = engine.decode(request.prompt_ids).rsplit("user\n", 1)[-1]
        if last.startswith('{"tool_results"'):
            return Script([ANSWER])
        return Script([CALL[:15], CALL[15:50], CALL[50:]])

    engine.script = script
    return engine


async def refused_for_no_calls(peer: RawPeer, results: list[dict[str, Any]], id: str) -> None:
    """``results`` sent as a ``tool_results`` frame get the refusal of results no call awaits."""
    await peer.send({"type": "tool_results", "id": id, "results": results})
    assert await peer.recv() == {
        "type": "error",
        "code": "invalid_params",
        "message": "no tool calls await results",
        "id": id,
    }


async def test_the_bundled_clients_run_answers_each_call_and_ends_with_the_answer() -> None:
    engine = tool_engine()
    async with running_server(engine) as url, connect(url) as chat:
        loop = chat.run("Weather in Paris?", tools=[WEATHER], tool_choice="required")
        events: list[Any] = []
        async for event in loop:
            events.append(event)
            if isinstance(event, CallRequest):
                event.answer({"sky": "clear", "c": 21})
        called, answered = loop.replies
        assert [type(e) for e in events] == [CallRequest, str]
        assert (events[0].name, events[0].arguments) == ("get_weather", {"city": "Paris"})
        assert events[1] == ANSWER == loop.text
        assert called.done is not None and answered.done is not None
        assert (called.done.reason, called.done.text) == (FinishReason.TOOL_CALLS, "")
        assert (called.done.turn, answered.done.turn) == (1, 1)  # one exchange
        assert called.tokens == [] and [c.call_id for c in called.calls] == [events[0].id]
        assert chat.turns == 1
        results = engine.decode(engine.requests[-1].prompt_ids).rsplit("user\n", 1)[-1]
        assert results.startswith(
            '{"tool_results": [{"name": "get_weather", "content": {"sky": "clear", "c": 21}}]}'
        )
        # the results turn offered the same tools: the prompt before it is its prefix
        first, second = (r.prompt_ids for r in engine.requests)
        assert second[: len(first)] == first


async def test_a_raw_msgpack_client_runs_the_loop_from_the_spec_alone() -> None:
    async with running_server(tool_engine()) as url, raw_peer(url) as (peer, _):
        tools = {"tools": [WEATHER], "tool_choice": {"name": "get_weather"}}
        await peer.send({"type": "prompt", "id": "p1", "text": "Paris?", "params": tools})
        frames = await peer.recv_until("done")
        assert [f["type"] for f in frames] == ["start", "tool_call", "done"]
        call, done = frames[1], frames[2]
        assert (call["id"], call["index"], call["name"]) == ("p1", 0, "get_weather")
        assert json.loads(call["arguments"]) == {"city": "Paris"}
        assert (done["reason"], done["text"], done["turn"]) == ("tool_calls", "", 1)
        results = [{"call_id": call["call_id"], "content": "sunny"}]
        await peer.send({"type": "tool_results", "id": "r1", "results": results, "params": tools})
        frames = await peer.recv_until("done")
        assert [f["type"] for f in frames] == ["start", "token", "done"]
        assert (frames[-1]["reason"], frames[-1]["text"], frames[-1]["turn"]) == (
            "stop",
            ANSWER,
            1,
        )
        await refused_for_no_calls(peer, results, "r2")


async def called(
    session: Any, rec: Any, gen_id: str = "p1", params: GenerationParams | None = TOOLS
) -> ToolCall:
    await session.handle(Prompt(gen_id, "Paris?", params=params))
    assert (await done_of(rec, gen_id)).reason is FinishReason.TOOL_CALLS
    (call,) = rec.of(ToolCall, gen_id)
    return call  # type: ignore[no-any-return]


def refusal(raised: pytest.ExceptionInfo[ProtocolError]) -> tuple[ErrorCode, str, str | None]:
    return raised.value.code, raised.value.message, raised.value.id


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ((ToolResult("call_nope", "x"),), "no tool call 'call_nope' awaits a result"),
        ((), "tool call '{id}' has no result"),
    ],
)
async def test_results_that_do_not_answer_the_awaited_calls_are_refused(
    results: tuple[ToolResult, ...], message: str
) -> None:
    session, rec = make_session(tool_engine())
    call = await called(session, rec)
    with pytest.raises(ProtocolError) as raised:
        await session.handle(ToolResults("r", results, TOOLS))
    expected = message.format(id=call.call_id)
    assert refusal(raised) == (ErrorCode.INVALID_PARAMS, expected, "r")
    assert session.chat.pending_calls and "r" not in session.core.used_ids


async def test_a_prompt_while_calls_await_results_is_refused_and_rewind_drops_them() -> None:
    session, rec = make_session(tool_engine())
    await called(session, rec)
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Prompt("p2", "something else"))
    message = "the last reply's tool calls await their results"
    assert refusal(raised) == (ErrorCode.INVALID_PARAMS, message, "p2")
    await session.handle(Rewind(0))
    assert session.chat.turns == 0 and session.chat.pending_calls == ()
    await session.handle(Prompt("p2", "something else"))
    assert (await done_of(rec, "p2")).turn == 1


async def test_a_call_whose_arguments_break_its_schema_fails_the_reply_and_is_not_kept() -> None:
    engine = tool_engine()
    answer = engine.script
    # the bad call is whole mid-reply, a second one still to come
    bad = Script([BAD_CALL[:-2], ", ", CALL[16:]])
    engine.script = lambda r: bad if len(engine.requests) == 1 else answer(r)
    session, rec = make_session(engine)
    await session.handle(Prompt("p1", "Paris?", params=TOOLS))
    done = await done_of(rec, "p1")
    (error,) = rec.of(Error, "p1")
    assert (error.code, error.message) == (
        ErrorCode.INTERNAL,
        "the engine called get_weather with arguments that do not match its parameters:"
        " 7 is not of type 'string' (at city)",
    )
    assert (done.reason, done.text) == (FinishReason.ERROR, "") and rec.of(ToolCall, "p1") == []
    assert session.chat.turns == 0 and session.chat.pending_calls == ()
    # nothing of it is kept: the same prompt again is the first exchange, prompted the same
    call = await called(session, rec, "p2")
    assert call.name == "get_weather" and (await done_of(rec, "p2")).turn == 1
    first, second = (r.prompt_ids for r in engine.requests)
    assert second == first


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            GenerationParams(tools=TOOLS.tools, tool_choice=ToolChoice("named", "other")),
            "tool_choice names 'other', which tools does not offer",
        ),
        (
            GenerationParams(tool_choice=ToolChoice("required")),
            "tool_choice required needs tools",
        ),
    ],
)
async def test_a_tool_choice_the_tools_cannot_meet_is_refused(
    params: GenerationParams, message: str
) -> None:
    session, _ = make_session(tool_engine())
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Prompt("p", "hi", params=params))
    assert refusal(raised) == (ErrorCode.INVALID_PARAMS, message, "p")


async def test_calls_awaiting_results_survive_a_store_and_are_answered_elsewhere() -> None:
    engine = tool_engine()
    session, rec = make_session(engine)
    call = await called(session, rec)
    state = unpack(pack(export_state(session)))
    elsewhere, rec2 = make_session(engine)
    import_state(elsewhere, state)
    assert elsewhere.chat.pending_calls == session.chat.pending_calls
    await elsewhere.handle(ToolResults("r", (ToolResult(call.call_id, "sunny"),), TOOLS))
    done: Done = await done_of(rec2, "r")
    assert (done.reason, done.text, done.turn) == (FinishReason.STOP, ANSWER, 1)
    assert engine.requests[-1].prompt_ids[: len(engine.requests[0].prompt_ids)] == (
        engine.requests[0].prompt_ids
    )


async def test_the_client_refuses_results_for_nothing_before_sending_nothing_wrong() -> None:
    async with running_server(tool_engine()) as url, connect(url, timeout=TIMEOUT) as chat:
        reply = chat.tool_results({"call_x": "sunny"})
        with pytest.raises(InvalidParamsError, match="no tool calls await results"):
            await reply.wait(TIMEOUT)


async def test_a_tool_loop_dropped_mid_call_resumes_with_its_call_and_goes_on() -> None:
    engine = tool_engine()
    answer = engine.script
    engine.script = lambda r: (
        Script([CALL[:15], CALL[15:50], CALL[50:]], stall_after=2)
        if len(engine.requests) == 1
        else answer(r)
    )
    session, _ = make_session(engine)
    await session.handle(Prompt("p1", "Paris?", params=TOOLS))
    await wait_until(lambda: session.core.accepted is not None and session.core.accepted.grew)
    await session.disconnect(grace_s=60)  # dropped mid-call: the reply goes on
    engine.unstall()
    await wait_until(lambda: session.run is None)
    catch_up = session.connect(None, TakenOver("b", ""), 0)
    assert catch_up is not None and catch_up.reply == "p1"
    call, done = catch_up.frames[-2:]
    assert isinstance(call, ToolCall) and call.name == "get_weather"
    assert isinstance(done, Done) and done.reason is FinishReason.TOOL_CALLS
    rec2 = Recorder()
    await session.attach(rec2)
    await session.handle(ToolResults("r", (ToolResult(call.call_id, "sunny"),), TOOLS))
    assert (await done_of(rec2, "r")).text == ANSWER
    await session.close()


async def test_tools_configured_as_the_sessions_default_serve_every_prompt_and_results() -> None:
    engine = tool_engine()
    session, rec = make_session(engine)
    await session.handle(Configure(params=TOOLS))
    call = await called(session, rec, "p1", params=None)
    await session.handle(ToolResults("r", (ToolResult(call.call_id, "sunny"),)))
    assert (await done_of(rec, "r")).text == ANSWER
    first, second = (r.prompt_ids for r in engine.requests)
    assert second[: len(first)] == first  # the same tools described: the same prompt


async def test_one_sessions_calls_and_tools_stay_its_own() -> None:
    engine = tool_engine()
    async with (
        running_server(engine) as url,
        raw_peer(url) as (first, _),
        raw_peer(url) as (second, _),
    ):
        await first.send(
            {"type": "configure", "params": {"tools": [WEATHER], "tool_choice": "required"}}
        )
        await first.send({"type": "prompt", "id": "p1", "text": "Paris?"})
        (call,) = [f for f in await first.recv_until("done") if f["type"] == "tool_call"]
        # the other session cannot answer the first one's call, nor is it offered its tools
        results = [{"call_id": call["call_id"], "content": "sunny"}]
        await refused_for_no_calls(second, results, "r1")
        await second.send({"type": "prompt", "id": "p2", "text": "Paris?"})
        assert [f["type"] for f in await second.recv_until("done")][-1] == "done"
        assert "get_weather" not in engine.decode(engine.requests[-1].prompt_ids)
        # the first session's call still awaits its result there, and is answered
        await first.send({"type": "tool_results", "id": "r2", "results": results})
        frames = await first.recv_until("done")
        assert (frames[-1]["reason"], frames[-1]["text"]) == ("stop", ANSWER)

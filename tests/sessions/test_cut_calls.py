"""A reply's calls at its budget on the WebSocket (PROTOCOL.md section 7 "Tool calls", note
23). Cut by its length while it writes its calls, the calls whole before the cut come as
``tool_call`` frames, the cut call is no call and never text, and ``done`` says ``length`` with
no text, no call awaiting results (the scripted engine writes one whole call and the start of a
second, then runs out of budget). A reply that writes call after call ends after the last that
leaves room for another before its closing reserve, with ``tool_calls``, and its calls await
results. The chat and Responses APIs' shapes of the same cut: tests/api/test_cut_calls.py."""

from __future__ import annotations

import json

import pytest
from wschat.server.engine import GenerationRequest

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import raw_peer, running_server

from .test_tool_loop import ANSWER, WEATHER, refused_for_no_calls

WHOLE = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}'
CUT = ', {"name": "get_weather", "arguments": {"ci'


def cut_engine() -> ScriptedEngine:
    """Writes a whole call and part of a second one, and ends at its length."""
    engine = ScriptedEngine()

    def script(request: GenerationRequest) -> Script:
        return Script([WHOLE[:20], WHOLE[20:], CUT[:12], CUT[12:]], end_with_eos=False)

    engine.script = script
    return engine


async def test_a_cut_call_on_the_websocket_is_no_token_and_the_done_has_no_text() -> None:
    async with running_server(cut_engine()) as url, raw_peer(url) as (peer, _):
        params = {"tools": [WEATHER], "tool_choice": "required"}
        await peer.send({"type": "prompt", "id": "p1", "text": "Paris?", "params": params})
        frames = await peer.recv_until("done")
        assert [f["type"] for f in frames] == ["start", "tool_call", "done"]
        call, done = frames[1], frames[2]
        assert (call["index"], call["name"], json.loads(call["arguments"])) == (
            0,
            "get_weather",
            {"city": "Paris"},
        )
        assert (done["reason"], done["text"], done["turn"]) == ("length", "", 1)
        # no call awaits results: the reply did not end with its calls
        results = [{"call_id": call["call_id"], "content": "sunny"}]
        await refused_for_no_calls(peer, results, "r1")


def repeating_engine(delay_s: float) -> ScriptedEngine:
    """Writes the same call again and again (five tokens each, ``delay_s`` apart) until its
    budget is spent, as the embedded base model does; answers once the results are the last
    turn."""
    engine = ScriptedEngine()
    one = ' {"name": "get_weather", "arguments": {"city": "Paris"}}'
    pieces = [one[:8], one[8:24], one[24:40], one[40:], ","]

    def script(request: GenerationRequest) -> Script:
        if engine.decode(request.prompt_ids).rsplit("user\n", 1)[-1].startswith('{"tool_res'):
            return Script([ANSWER])
        tokens = ['{"tool_calls": [', *pieces * 20][: request.params.max_new_tokens]
        return Script(tokens, delay_s=delay_s, end_with_eos=False)

    engine.script = script
    return engine


# 0: the reply has ended, its exchange kept, when its calls are read; 10 ms: it is running
@pytest.mark.parametrize("delay_s", [0.0, 0.01])
async def test_calls_without_end_end_after_the_last_that_leaves_room_for_another(
    delay_s: float,
) -> None:
    engine = repeating_engine(delay_s)
    async with running_server(engine) as url, raw_peer(url) as (peer, _):
        # 40 tokens, the last 10 the closing reserve; each call whole 5 tokens after the last
        # (the first's count the opening): the 6th ends at 30, and a 7th would not fit
        params = {"tools": [WEATHER], "tool_choice": "required", "max_new_tokens": 40}
        await peer.send({"type": "prompt", "id": "p1", "text": "Paris?", "params": params})
        frames = await peer.recv_until("done")
        calls, done = frames[1:-1], frames[-1]
        # token frames merged while the reader is behind (with no delay, or a busy machine)
        # count a call's end at the frame that completed it, a few tokens late: then the 5th
        # already leaves no room
        assert {f["type"] for f in calls} == {"tool_call"} and 5 <= len(calls) <= 6
        assert (done["reason"], done["text"], done["turn"]) == ("tool_calls", "", 1)
        assert all(json.loads(f["arguments"]) == {"city": "Paris"} for f in calls)
        results = [{"call_id": f["call_id"], "content": "sunny"} for f in calls]
        await peer.send({"type": "tool_results", "id": "r1", "results": results})
        frames = await peer.recv_until("done")
        assert (frames[-1]["reason"], frames[-1]["text"], frames[-1]["turn"]) == (
            "stop",
            ANSWER,
            1,
        )

"""Structured output, logprobs and a forced tool call (PROTOCOL.md ``params.response_format``,
``params.logprobs``, ``tool_call``), the same on every engine: in process the grammar holds the
tiny random model's reply; with ``--engine openai`` the schema and the logprobs request go on
to llama.cpp's server (``json_schema``, ``n_probs``) and it holds the embedded model's."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from tests.structured import BOUNDED
from tests.support import RawPeer, raw_peer

from .test_protocol import of

# llama.cpp on 2 busy cores takes seconds to prefill a prompt that describes tools
SLOW = 180.0


async def prompt(peer: RawPeer, frame_id: str, text: str, **params: Any) -> list[dict[str, Any]]:
    await peer.send({"type": "prompt", "id": frame_id, "text": text, "params": params})
    return await peer.recv_until("done", SLOW)


WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


async def test_a_reply_held_to_a_strict_json_schema_parses_and_validates(chat_url: str) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "pick", "schema": BOUNDED, "strict": True},
    }
    async with raw_peer(chat_url) as (peer, _):
        frames = await prompt(
            peer, "a", "Pick a colour.", max_new_tokens=48, response_format=response_format
        )
        done = frames[-1]
        assert done["reason"] == "stop", done["text"]
        jsonschema.validate(json.loads(done["text"]), BOUNDED)
        # the session goes on without a format
        plain = (await prompt(peer, "b", "Hello", max_new_tokens=4))[-1]
        assert plain["reason"] in ("stop", "length")


async def test_each_token_frame_carries_its_logprob_and_its_top_alternatives(
    chat_url: str,
) -> None:
    async with raw_peer(chat_url) as (peer, _):
        frames = await prompt(peer, "a", "Hello", max_new_tokens=6, logprobs=3, temperature=0.0)
    tokens = of(frames, "token")
    assert tokens
    for frame in tokens:
        entry = frame["logprobs"]
        assert entry["top"] == 3
        n = len(entry["ids"])
        assert n >= 1 and len(entry["tokens"]) == len(entry["token_bytes"]) == n
        assert len(entry["logprobs"]) == n
        assert len(entry["top_ids"]) == len(entry["top_logprobs"]) == 3 * n
        assert all(value <= 0 for value in entry["logprobs"])
        for k in range(len(entry["ids"])):
            top = entry["top_logprobs"][3 * k : 3 * k + 3]
            assert top == sorted(top, reverse=True)
            # greedy: the chosen token is the most probable one
            assert entry["logprobs"][k] >= top[0] - 1e-3


async def test_a_forced_tool_call_is_valid_and_its_result_continues_the_exchange(
    chat_url: str,
) -> None:
    tools: dict[str, Any] = {"tools": [WEATHER], "tool_choice": {"name": "get_weather"}}
    tools["parallel_tool_calls"] = False
    async with raw_peer(chat_url) as (peer, _):
        frames = await prompt(peer, "p1", "Weather in Paris?", max_new_tokens=48, **tools)
        assert [f["type"] for f in frames] == ["start", "tool_call", "done"], frames
        call, done = frames[1], frames[2]
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])
        assert (done["reason"], done["text"], done["turn"]) == ("tool_calls", "", 1)
        results = [{"call_id": call["call_id"], "content": "sunny"}]
        params = {"max_new_tokens": 4}
        await peer.send({"type": "tool_results", "id": "r1", "results": results, "params": params})
        answered = (await peer.recv_until("done", SLOW))[-1]
        assert answered["reason"] in ("stop", "length") and answered["turn"] == 1

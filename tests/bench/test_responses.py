"""The Responses API's WebSocket mode scenario (bench/responses.py): its targets and table, and
its SDK streams and conversation against a real uvicorn, every token counted as the msgpack
WebSocket's are."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from bench import render, responses, wsload
from bench.openai_api import RATIOS, round_ratio
from bench.responses import ResponsesWork
from tests.bench.test_openai_api import figures
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server


def result() -> dict[str, Any]:
    ws, mode, raw = figures([10.0], [0.1]), figures([9.6], [0.105]), figures([8.0], [0.2])
    streams = {"websocket": {1: ws}, "responses-ws": {1: mode}, "responses-raw": {1: raw}}
    return {
        "workload": {"tokens": 64, "rounds": 1},
        "engine": "batched",
        "streams": streams,
        "ratios": {
            api: {1: {key: round_ratio(streams[api][1], ws, key) for key in RATIOS}}
            for api in responses.APIS
        },
        "conversation": [
            {"ttft": 0.10, "input_tokens": 18, "cached_tokens": 0},
            {"ttft": 0.14, "input_tokens": 1000, "cached_tokens": 950},
        ],
    }


def test_the_targets_are_095_for_tokens_11_for_ttft_and_the_last_turns_cache() -> None:
    met = {row.target: row.met for row in responses.targets(result())}
    assert met == {
        "SDK WebSocket mode tokens/s at 1 streams vs msgpack WebSocket": True,
        "SDK WebSocket mode stream tokens/s at 1 streams vs msgpack WebSocket": True,
        "SDK WebSocket mode TTFT (WebSocket's/SDK's) at 1 streams vs msgpack WebSocket": True,
        "turn 2 continued on one socket: cached share of its input": True,
        "turn 2 continued on one socket: TTFT vs turn 1": False,
    }
    text = render.text(responses.report(result()))
    assert "responses-ws         1       9.6" in text
    assert "responses-raw        1       8.0" in text  # beside, judged by no target
    assert "turn  2: input  1000, cached   950, TTFT 140 ms" in text


async def test_the_sdks_socket_streams_count_the_tokens_the_msgpack_websocket_counts() -> None:
    words = [" one", " two", " three", " four", " five"]
    engine = ScriptedEngine(lambda request: Script(words, end_with_eos=False))
    async with running_server(engine) as url:
        base = http_base(url) + "/v1"
        async with (
            asyncio.timeout(TIMEOUT),
            openai.AsyncOpenAI(base_url=base, api_key="-") as client,
        ):
            mode = await responses.socket_streams(client, ["Hi", "Hello"], 16)
            raw = await responses.raw_streams(url, ["Hi", "Hello"], 16)
            ws = await wsload.concurrent(url, ["Hi", "Hello"], 16)
            turns = await responses.conversation(client, ResponsesWork(turns=3, turn_tokens=8))
    counts = [len(t.tokens) for t in ws]
    assert [len(t.tokens) for t in mode] == [len(t.tokens) for t in raw] == counts == [5, 5]
    assert all(t.ttft > 0 for t in [*mode, *raw])
    inputs = [t["input_tokens"] for t in turns]
    assert len(inputs) == 3 and inputs[0] < inputs[1] < inputs[2]  # each turn goes on from the last

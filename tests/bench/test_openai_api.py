"""The OpenAI-compatible API scenario: the paired ratios (round by round), the targets and the
table; the plain HTTP client against a real uvicorn, read as the SDK reads the stream."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from bench import openai_api, render
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, http_base, running_server


def figures(tps: list[float], ttft: list[float]) -> dict[str, Any]:
    return {
        "aggregate_tps": sorted(tps)[len(tps) // 2],
        "stream_tps": sorted(tps)[len(tps) // 2],
        "ttft_median_s": sorted(ttft)[len(ttft) // 2],
        "aggregate_tps_rounds": tps,
        "stream_tps_rounds": tps,
        "ttft_median_s_rounds": ttft,
    }


def test_a_ratio_is_the_median_of_the_rounds_ratios_so_a_slow_round_slows_both() -> None:
    ws = figures([10.0, 20.0, 20.0], [0.1, 0.05, 0.05])
    sdk = figures([9.8, 19.6, 10.0], [0.1, 0.05, 0.1])
    assert openai_api.round_ratio(sdk, ws, "aggregate_tps") == pytest.approx(0.98)
    assert openai_api.round_ratio(sdk, ws, "ttft_median_s") == 1.0  # the WebSocket's over the SDK's


def result() -> dict[str, Any]:
    ws = figures([10.0], [0.1])
    apis = {"openai-sdk": figures([9.6], [0.1]), "http": figures([10.1], [0.08])}
    ratios = {
        api: {1: {key: openai_api.round_ratio(f, ws, key) for key in openai_api.RATIOS}}
        for api, f in apis.items()
    }
    return {
        "workload": {"tokens": 64, "rounds": 1},
        "engine": "batched",
        "streams": {"websocket": {1: ws}, **{api: {1: f} for api, f in apis.items()}},
        "ratios": ratios,
        "conversation": [
            {"ttft": 0.10, "prompt_tokens": 18, "cached_tokens": 0},
            {"ttft": 0.12, "prompt_tokens": 1000, "cached_tokens": 950},
        ],
    }


def test_the_targets_are_met_at_095_and_for_the_last_turn_resent_whole() -> None:
    met = {row.target: row.met for row in openai_api.targets(result())}
    assert met == {
        "openai sdk tokens/s at 1 streams vs WebSocket": True,
        "openai sdk stream tokens/s at 1 streams vs WebSocket": True,
        "openai sdk TTFT (WebSocket's/SDK's) at 1 streams vs WebSocket": True,
        "turn 2 resent whole: cached share of its prompt": True,
        "turn 2 resent whole: TTFT vs turn 1": True,
    }


def test_the_report_has_a_line_per_api_and_streams_and_per_turn() -> None:
    text = render.text(openai_api.report(result()))
    assert "openai-sdk         1       9.6" in text
    assert "http               1      10.1" in text
    assert "1.010x, 1.250x" in text  # the plain client's tokens/s and TTFT against the WebSocket's
    assert "turn  2: prompt  1000, cached   950, TTFT 120 ms" in text


async def test_the_plain_client_reads_every_token_the_sdk_reads() -> None:
    """Both clients stamp each token by the chunk it came in, and those ``usage`` counts beyond
    the chunks (a chunk of several: the engine outran the client) at the last chunk."""
    words = [" one", " two", " three", " four", " five"]
    engine = ScriptedEngine(lambda request: Script(words, end_with_eos=False))
    async with running_server(engine) as url:
        base = http_base(url) + "/v1"
        async with asyncio.timeout(TIMEOUT):
            plain = await openai_api._http_streams(base, ["Hi", "Hello"], 16)
            async with openai.AsyncOpenAI(base_url=base, api_key="-") as client:
                sdk = await openai_api._sdk_streams(client, ["Hi", "Hello"], 16)
    assert [len(t.tokens) for t in plain] == [len(t.tokens) for t in sdk] == [5, 5]
    assert all(t.ttft > 0 for t in plain)

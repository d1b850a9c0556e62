"""The OpenAI-compatible API scenario's pure parts: the paired ratios (round by round), the
targets and the table."""

from __future__ import annotations

from typing import Any

import pytest

from bench import openai_api


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
    ws, sdk = figures([10.0], [0.1]), figures([9.6], [0.1])
    ratios = {key: openai_api.round_ratio(sdk, ws, key) for key in openai_api.RATIOS}
    return {
        "workload": {"tokens": 64, "rounds": 1},
        "engine": "batched",
        "streams": {"websocket": {1: ws}, "openai-sdk": {1: sdk}},
        "ratios": {1: ratios},
        "conversation": [
            {"ttft": 0.10, "prompt_tokens": 18, "cached_tokens": 0},
            {"ttft": 0.12, "prompt_tokens": 1000, "cached_tokens": 950},
        ],
    }


def test_the_targets_are_met_at_095_and_for_the_last_turn_resent_whole() -> None:
    met = {row["target"]: row["met"] for row in openai_api.targets(result())}
    assert met == {
        "openai sdk tokens/s at 1 streams vs WebSocket": True,
        "openai sdk stream tokens/s at 1 streams vs WebSocket": True,
        "openai sdk TTFT (WebSocket's/SDK's) at 1 streams vs WebSocket": True,
        "turn 2 resent whole: cached share of its prompt": True,
        "turn 2 resent whole: TTFT vs turn 1": True,
    }


def test_the_report_has_a_line_per_api_and_streams_and_per_turn() -> None:
    text = openai_api.report({"openai": result()})
    assert "openai-sdk         1       9.6" in text
    assert "turn  2: prompt  1000, cached   950, TTFT 120 ms" in text

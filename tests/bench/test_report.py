"""The main run's table: llama.cpp's server as a peer row beside ours, and on the chart."""

from __future__ import annotations

from typing import Any

from bench import chart, report
from bench.llamacpp import PEER


def figures(stream: list[float], aggregate: list[float], ttft: float) -> dict[int, Any]:
    """Figures at 1 and 8 sessions from each round's one-stream rate and 8-session aggregate."""
    return {
        1: {"stream_tps": sorted(stream)[1], "stream_tps_rounds": stream, "aggregate_tps": 1.0,
            "ttft_median_s": ttft, "ttft_p95_s": ttft},
        8: {"stream_tps": 1.0, "aggregate_tps": sorted(aggregate)[1],
            "aggregate_tps_rounds": aggregate, "ttft_median_s": ttft * 2, "ttft_p95_s": ttft * 3},
    }  # fmt: skip


def result(peer: Any) -> dict[str, Any]:
    return {
        "engine": "batched",
        "wschat-batched": figures([18.0, 17.0, 19.0], [110.0, 100.0, 120.0], 0.080),
        "peers": {"skipped": "--no-peer", PEER: peer},
    }


def test_the_peer_line_gives_llama_cpp_over_ours_round_by_round() -> None:
    theirs = figures([36.0, 34.0, 57.0], [132.0, 110.0, 120.0], 0.040)
    # rounds: 2.0, 2.0, 3.0 -> 2.0; 1.2, 1.1, 1.0 -> 1.1 (the medians' ratio would be 1.091)
    assert report.peer_lines(result(theirs)) == [
        "llama.cpp's server / wschat: 1 stream 2.000x tokens/s, TTFT 40 ms vs 80 ms; "
        "8 sessions 1.100x aggregate, TTFT p95 120 ms vs 240 ms"
    ]


def test_no_peer_line_when_llama_cpp_did_not_run() -> None:
    assert report.peer_lines(result("xllamacpp is not installed")) == []
    assert report.peer_lines(result({"error": "RuntimeError()"})) == []


def test_the_chart_draws_llama_cpp_beside_ours() -> None:
    theirs = figures([36.0, 34.0, 57.0], [121.0, 100.0, 132.0], 0.040)
    drawn = chart.series(result(theirs))
    assert sorted(drawn) == [PEER, "wschat-batched"]
    assert drawn[PEER][8]["aggregate_tps"] == 121.0

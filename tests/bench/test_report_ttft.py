"""report.py's first-token targets: 8 sessions against the static batch, round by round, and
the conversation's last turn against its first, run by run."""

from __future__ import annotations

from typing import Any

import pytest

from bench import render, report
from bench.figures import Target


def figures(ttft_p95: list[float]) -> dict[str, Any]:
    return {"stream_tps": 10.0, "stream_tps_rounds": [10.0] * len(ttft_p95),
            "aggregate_tps": 80.0, "ttft_median_s": ttft_p95[0], "ttft_p95_s": sorted(ttft_p95)[1],
            "itl_p95_s": 0.05,
            "ttft_p95_rounds": ttft_p95}  # fmt: skip


def result(ours: list[float], ceiling: list[float], runs: list[list[float]]) -> dict[str, Any]:
    turns = [{"ttft": sorted(run[i] for run in runs)[len(runs) // 2], "cached_tokens": 0,
              "prompt_tokens": 18} for i in range(len(runs[0]))]  # fmt: skip
    return {
        "engine": "batched",
        "wschat-batched": {1: figures([0.07] * 3), 8: figures(ours)},
        "ceiling": {1: figures([0.06] * 3), 8: figures(ceiling)},
        "conversation": turns,
        "conversation_runs": runs,
        "cancel": {"count": 1, "median_s": 0.01, "p95_s": 0.01, "decode_step_s": 0.05},
        "memory": {"sessions": 10, "rss_none_mb": 100.0, "rss_idle_mb": 101.0, "delta_mb": 1.0},
    }


def row(rows: list[Target], starts: str) -> Target:
    (found,) = [r for r in rows if r.target.startswith(starts)]
    return found


def test_ttft_p95_at_8_sessions_is_the_median_of_round_by_round_ratios() -> None:
    # rounds: 0.30/0.15 = 2.0, 0.18/0.15 = 1.2, 0.11/0.10 = 1.1 -> 1.2 (medians: 0.18/0.15)
    rows = report.targets(result([0.30, 0.18, 0.11], [0.15, 0.15, 0.10], [[0.05, 0.06]]))
    target = row(rows, "8 sessions TTFT p95")
    assert target.target == "8 sessions TTFT p95 <= 1.2 x static batch's"
    assert target.ratio == pytest.approx(1.2)
    assert target.met is True


def test_ttft_p95_falls_back_to_the_medians_without_rounds() -> None:
    ours, ceiling = figures([0.3, 0.3, 0.3]), figures([0.1, 0.1, 0.1])
    del ours["ttft_p95_rounds"]
    assert report.ttft_p95_ratio(ours, ceiling) == pytest.approx(3.0)


def test_turn_10_against_turn_1_is_the_median_of_each_runs_own_ratio() -> None:
    runs = [[0.05, 0.06, 0.08], [0.04, 0.05, 0.08], [0.06, 0.05, 0.06], [0.05, 0.07, 0.065]]
    assert report.turn_ratios(result([0.1] * 3, [0.1] * 3, runs)) == pytest.approx(
        [1.6, 2.0, 1.0, 1.3]
    )
    target = row(report.targets(result([0.1] * 3, [0.1] * 3, runs)), "turn 3 TTFT")
    assert target.target == "turn 3 TTFT <= 1.3 x turn 1 (median of 4 runs)"
    assert target.ratio == pytest.approx(1.45)
    assert target.met is False


def test_the_table_gives_each_runs_last_turn_over_its_first() -> None:
    text = render.text(report.section(result([0.1] * 3, [0.1] * 3, [[0.05, 0.06], [0.04, 0.05]])))
    assert "turn 2 / turn 1 in each run: 1.200x 1.250x" in text.splitlines()

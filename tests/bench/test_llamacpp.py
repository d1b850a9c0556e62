"""The llama.cpp scenario's ratios, differences, targets and table, from figures of our own."""

from __future__ import annotations

import math
from typing import Any

from bench import llamacpp, report
from bench.llamacpp import DIRECT, GATEWAY

# per system and stream count: each round's aggregate tokens/s and median TTFT (s)
ROUNDS = {
    DIRECT: {1: ([20.0, 10.0, 30.0], [0.050, 0.060, 0.040]), 8: ([100.0, 80.0], [0.2, 0.3])},
    GATEWAY: {1: ([19.0, 9.0, 30.0], [0.060, 0.080, 0.045]), 8: ([90.0, 80.0], [0.25, 0.3])},
    "wschat-batched": {1: ([10.0, 5.0, 15.0], [0.1, 0.1, 0.1]), 8: ([50.0, 40.0], [0.4, 0.5])},
}


def figures() -> dict[str, dict[int, dict[str, Any]]]:
    return {
        system: {
            n: {
                "aggregate_tps": sorted(agg)[len(agg) // 2],
                "stream_tps": agg[0] / n,
                "ttft_median_s": sorted(ttft)[len(ttft) // 2],
                "ttft_p95_s": max(ttft),
                "aggregate_tps_rounds": agg,
                "ttft_rounds": ttft,
            }
            for n, (agg, ttft) in by_n.items()
        }
        for system, by_n in ROUNDS.items()
    }


def result() -> dict[str, Any]:
    waits = [
        {"done_s": 0.004, "idle_s": 0.020, "direct_idle_s": 0.015},
        {"done_s": 0.006, "idle_s": 0.030, "direct_idle_s": 0.010},
        {"done_s": 0.005, "idle_s": 0.025, "direct_idle_s": 0.020},
    ]
    return {
        "workload": {"tokens": 64, "rounds": 3},
        "threads": 2,
        "slots": 8,
        "xllamacpp": "0.2.0",
        "figures": figures(),
        "compared": llamacpp.compare(figures()),
        "cancel": llamacpp.cancel_summary(waits),
    }


def test_ratios_are_medians_of_round_by_round_ratios_to_direct() -> None:
    compared = llamacpp.compare(figures())
    # rounds: 19/20, 9/10, 30/30 -> median 0.95 (not 19/20 of the medians' ratio, 19/20 too
    # here, but 8 streams tells them apart: 90/100, 80/80 -> 0.95, medians 85/90)
    assert compared[GATEWAY][1]["aggregate_x"] == 0.95
    assert compared[GATEWAY][8]["aggregate_x"] == 0.95
    assert compared[DIRECT][1]["aggregate_x"] == 1.0
    assert compared["wschat-batched"][8]["aggregate_x"] == 0.5


def test_ttft_differences_are_medians_of_round_by_round_differences() -> None:
    compared = llamacpp.compare(figures())
    assert math.isclose(compared[GATEWAY][1]["ttft_diff_s"], 0.010)  # 10, 20, 5 ms
    assert math.isclose(compared[GATEWAY][8]["ttft_diff_s"], 0.025)  # 50, 0 ms
    assert compared[DIRECT][8]["ttft_diff_s"] == 0.0


def test_rounds_of_unequal_counts_give_no_ratio() -> None:
    assert math.isnan(llamacpp.paired_ratio([1.0, 2.0], [1.0]))
    assert math.isnan(llamacpp.paired_difference([], []))


def test_targets_hold_wschat_to_direct_at_1_and_8_streams() -> None:
    rows = llamacpp.targets(result())
    assert [(r["target"], r["met"]) for r in rows] == [
        ("llama.cpp, 1 stream: wschat agg tok/s >= 0.95 x direct", True),
        ("llama.cpp, 1 stream: wschat TTFT <= direct + 15 ms", True),
        ("llama.cpp, 8 streams: wschat agg tok/s >= 0.95 x direct", True),
        ("llama.cpp, 8 streams: wschat TTFT <= direct + 15 ms", False),
    ]
    assert (rows[0]["value"], rows[0]["against"]) == (19.0, 20.0)
    assert math.isclose(rows[3]["ratio"], 0.025)


def test_cancel_summary_gives_median_and_p95_of_each_timing() -> None:
    cancel = result()["cancel"]
    assert cancel["count"] == 3
    assert cancel["idle_s"] == {"median_s": 0.025, "p95_s": 0.030}
    assert cancel["done_s"]["median_s"] == 0.005
    assert cancel["direct_idle_s"]["p95_s"] == 0.020


def test_the_table_has_a_row_per_system_and_count_the_cancels_and_the_targets() -> None:
    text = report.llamacpp_table({"llamacpp": result()})
    lines = text.splitlines()
    gateway_one = next(line for line in lines if line.startswith(GATEWAY) and " 1 " in line)
    assert "0.950x" in gateway_one and "10 ms" in gateway_one
    assert sum(line.startswith(("llama.cpp direct", "wschat-")) for line in lines) == 6
    assert "cancel to slot idle median 25 ms, p95 30 ms" in text
    assert "direct close to slot idle median 15 ms" in text
    assert text.count(" NO") == 1


def test_the_engine_gets_every_core_but_the_last_and_the_front_the_last(monkeypatch: Any) -> None:
    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    work = llamacpp.LlamaWork()
    assert work.cores() == ({0, 1, 2}, {3})
    assert work.thread_count() == 3
    assert llamacpp.LlamaWork(threads=2).thread_count() == 2


def test_one_core_or_no_split_shares_every_core(monkeypatch: Any) -> None:
    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {5})
    assert llamacpp.LlamaWork().cores() == ({5}, {5})
    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {0, 1})
    assert llamacpp.LlamaWork(split_cores=False).cores() == ({0, 1}, {0, 1})

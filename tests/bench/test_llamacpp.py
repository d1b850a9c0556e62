"""The llama.cpp scenario's ratios, differences, targets and table, from figures of our own, and
the plain request that stands for "llama.cpp direct"."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from bench import llamacpp, render
from bench.__main__ import judged
from bench.figures import Target
from bench.llamacpp import DIRECT, SHARED, SPLIT, VIA_LLAMACPP, VIA_OPENAI

LOCAL = "wschat in process (batched)"
BEFORE = "wschat in process, bfloat16"

# per system and stream count: each round's aggregate tokens/s and median TTFT (s)
SHARED_ROUNDS = {
    DIRECT: {1: ([40.0, 50.0, 60.0], [0.030, 0.020, 0.040]), 8: ([100.0, 120.0], [0.2, 0.3])},
    VIA_LLAMACPP: {1: ([39.0, 48.0, 60.0], [0.031, 0.021, 0.045]), 8: ([99.0, 110.0], [0.2, 0.3])},
    VIA_OPENAI: {1: ([36.0, 45.0, 60.0], [0.040, 0.030, 0.050]), 8: ([96.0, 120.0], [0.3, 0.3])},
    LOCAL: {1: ([28.0, 30.0, 33.0], [0.060, 0.060, 0.080]), 8: ([150.0, 110.0], [0.1, 0.2])},
    BEFORE: {1: ([10.0, 15.0, 11.0], [0.09, 0.09, 0.09]), 8: ([80.0, 80.0], [0.3, 0.3])},
}
SPLIT_ROUNDS = {
    DIRECT: {1: ([20.0, 10.0, 30.0], [0.050, 0.060, 0.040]), 8: ([100.0, 80.0], [0.2, 0.3])},
    VIA_LLAMACPP: {1: ([19.0, 9.0, 30.0], [0.060, 0.080, 0.045]), 8: ([90.0, 80.0], [0.25, 0.3])},
    VIA_OPENAI: {1: ([19.0, 10.0, 29.0], [0.05, 0.07, 0.04]), 8: ([100.0, 79.0], [0.2, 0.3])},
}


def figures(rounds: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
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
        for system, by_n in rounds.items()
    }


def layout(rounds: dict[str, Any], cores: list[int], **extra: Any) -> dict[str, Any]:
    made = figures(rounds)
    return {
        "threads": len(cores),
        "engine_cores": cores,
        "front_cores": [1],
        "figures": made,
        "compared": llamacpp.compare(made),
        **extra,
    }


def result() -> dict[str, Any]:
    waits = [
        {"done_s": 0.004, "idle_s": 0.020, "direct_idle_s": 0.015},
        {"done_s": 0.006, "idle_s": 0.030, "direct_idle_s": 0.010},
        {"done_s": 0.005, "idle_s": 0.025, "direct_idle_s": 0.020},
    ]
    local = {"inprocess": LOCAL, "before": BEFORE, "before_dtype": "bfloat16"}
    return {
        "workload": {"tokens": 64, "rounds": 3},
        "slots": 8,
        "xllamacpp": "0.2.0",
        "layouts": {
            SHARED: layout(
                SHARED_ROUNDS,
                [0, 1],
                dtype="bf16-packed",
                rss_mb={LOCAL: 1200.0, BEFORE: 1250.0},
                **local,
            ),
            SPLIT: layout(SPLIT_ROUNDS, [0]),
        },
        "cancel": llamacpp.cancel_summary(waits),
    }


def test_ratios_are_medians_of_round_by_round_ratios_to_direct() -> None:
    compared = llamacpp.compare(figures(SPLIT_ROUNDS))
    # rounds: 19/20, 9/10, 30/30 -> median 0.95; 8 streams: 90/100, 80/80 -> 0.95, where the
    # medians' ratio would be 85/90
    assert compared[VIA_LLAMACPP][1]["aggregate_x"] == 0.95
    assert compared[VIA_LLAMACPP][8]["aggregate_x"] == 0.95
    assert compared[DIRECT][1]["aggregate_x"] == 1.0


def test_ttft_is_compared_as_a_difference_and_as_a_ratio_round_by_round() -> None:
    compared = llamacpp.compare(figures(SPLIT_ROUNDS))
    assert math.isclose(compared[VIA_LLAMACPP][1]["ttft_diff_s"], 0.010)  # 10, 20, 5 ms
    assert math.isclose(compared[VIA_LLAMACPP][8]["ttft_diff_s"], 0.025)  # 50, 0 ms
    assert math.isclose(compared[VIA_LLAMACPP][1]["ttft_x"], 1.2)  # 1.2, 1.333, 1.125
    assert compared[DIRECT][8]["ttft_diff_s"] == 0.0


def test_rounds_of_unequal_counts_give_no_ratio() -> None:
    assert math.isnan(llamacpp.paired_ratio([1.0, 2.0], [1.0]))
    assert math.isnan(llamacpp.paired_difference([], []))


def targets_by_name() -> dict[str, Target]:
    return {row.target: row for row in llamacpp.targets(result())}


def test_both_fronts_are_held_to_direct_in_both_layouts_and_ttft_in_the_split_one() -> None:
    rows = targets_by_name()
    for where in (SHARED, SPLIT):
        for system in (VIA_LLAMACPP, VIA_OPENAI):
            for streams in ("1 stream", "8 streams"):
                assert f"{where}, {streams}: {system} agg >= 0.95 x direct" in rows
    assert sum("TTFT <= direct" in name for name in rows) == 4  # split only, 2 fronts x 1 and 8
    assert rows[f"split, 8 streams: {VIA_LLAMACPP} agg >= 0.95 x direct"].met
    assert not rows[f"split, 8 streams: {VIA_LLAMACPP} TTFT <= direct + 15 ms"].met  # 25 ms
    # 36/40, 45/50, 60/60 -> 0.9
    assert not rows[f"shared, 1 stream: {VIA_OPENAI} agg >= 0.95 x direct"].met


def test_the_in_process_engine_is_held_to_llama_cpp_and_to_the_dtype_before() -> None:
    rows = targets_by_name()
    one = rows["shared, 1 stream: in process agg >= 0.6 x llama.cpp"]
    assert (one.ratio, one.met) == (0.6, True)  # 0.7, 0.6, 0.55
    eight = rows["shared, 8 streams: in process agg >= 1.0 x llama.cpp"]
    assert (eight.ratio, eight.met) == (pytest.approx((1.5 + 110 / 120) / 2), True)
    ttft = rows["shared, 1 stream: in process TTFT <= 2.5 x llama.cpp's"]
    assert (ttft.ratio, ttft.met) == (pytest.approx(2.0), True)  # 2, 3, 2
    before = rows["shared, 1 stream: bf16-packed >= 2.5 x bfloat16"]
    assert (before.ratio, before.met) == (pytest.approx(2.8), True)  # 2.8, 2.0, 3.0
    rss = rows["shared: in process RSS <= bfloat16's (same streams)"]
    assert (rss.ratio, rss.met) == (pytest.approx(0.96), True)
    assert not any(name.startswith("split") and "in process" in name for name in rows)


def test_the_table_has_a_block_per_layout_a_row_per_system_and_count_and_the_cancels() -> None:
    text = render.text(llamacpp.report(result()))
    lines = text.splitlines()
    assert any(line.startswith("shared: llama.cpp 2 threads on cores [0, 1]") for line in lines)
    assert any(line.startswith("split: llama.cpp 1 threads on cores [0]") for line in lines)
    systems = (DIRECT, VIA_LLAMACPP, VIA_OPENAI, LOCAL, BEFORE)
    assert sum(line.startswith(systems) for line in lines) == 2 * 5 + 2 * 3
    split_llamacpp = [line for line in lines if line.startswith(VIA_LLAMACPP)][-2]
    assert "0.950x" in split_llamacpp and "10 ms" in split_llamacpp
    assert f"RSS after the rounds: {LOCAL} 1200 MB, {BEFORE} 1250 MB" in text
    assert "cancel to slot idle median 25 ms, p95 30 ms" in text
    assert "direct close to slot idle median 15 ms" in text
    rows = llamacpp.targets(result())
    assert text.count(" NO") == sum(not row.met for row in rows) > 0


def test_the_split_layout_gives_llama_cpp_every_core_but_the_last(monkeypatch: Any) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert llamacpp.layout_cores(SPLIT) == ({0, 1, 2}, {3})
    assert llamacpp.layout_cores(SHARED) == ({0, 1, 2, 3}, {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert llamacpp.layout_cores(SPLIT) == ({5}, {5})


def test_direct_is_a_plain_request_of_the_turn_as_text() -> None:
    body = llamacpp.plain_body("Hi there", 16)
    assert body == {
        "prompt": "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }


@pytest.mark.parametrize(
    ("chunk", "tokens"),
    [
        ({"choices": [{"text": " a", "finish_reason": None}]}, 1),
        ({"choices": [{"text": "", "finish_reason": None}]}, 1),  # a token of a split character
        ({"choices": [{"text": "", "finish_reason": "length"}], "usage": {}}, 0),
    ],
)
def test_each_streamed_choice_but_the_closing_one_is_a_token(
    chunk: dict[str, Any], tokens: int
) -> None:
    assert llamacpp._tokens_in(chunk) == tokens


def test_the_dtype_before_packed_weights_is_bf16_only_where_the_cpu_has_bf16(
    monkeypatch: Any, tmp_path: Any
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(llamacpp, "CPUINFO", cpuinfo)
    cpuinfo.write_text("flags : fpu avx2 avx512f avx512_bf16\n")
    assert llamacpp.before_dtype() == "bfloat16"
    cpuinfo.write_text("flags : fpu avx2\n")
    assert llamacpp.before_dtype() == "float32"


def test_the_main_runs_table_and_targets_take_the_llama_cpp_scenario() -> None:
    from tests.bench.test_report_ttft import result as main_run

    run = main_run([0.1] * 3, [0.1] * 3, [[0.05, 0.06]]) | {"llamacpp": result()}
    text = judged(run, None)
    assert "\n".join(render.section_lines(llamacpp.report(result()))) in text
    names = [row["target"] for row in run["targets"]]
    assert "shared, 1 stream: in process agg >= 0.6 x llama.cpp" in names
    skipped = main_run([0.1] * 3, [0.1] * 3, [[0.05, 0.06]])
    skipped["llamacpp"] = {"skipped": "xllamacpp is not installed"}
    assert "no llamacpp scenario: xllamacpp is not installed" in judged(skipped, None)

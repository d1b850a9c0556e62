"""The host classes' pure parts: the caps each class sets, the interleaved rounds' ratios, the
classes scenario's targets and table (bench/hostclass.py, bench/classes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import classes, hostclass, llamacpp, render
from bench.stats import StreamTimes


def test_a_class_replaces_the_caps_set_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not set(hostclass.CAPS) & set(hostclass.env_of(hostclass.AMX))
    emulated = hostclass.env_of(hostclass.AVX512_BF16)
    assert emulated["ATEN_CPU_CAPABILITY"] == "avx512"
    assert emulated["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"


def test_interleaved_rounds_rotate_the_first_and_the_speedup_pairs_rounds() -> None:
    seen: list[str] = []
    calls = {name: (lambda name=name: seen.append(name)) for name in "abc"}
    times = hostclass.interleaved(calls, rounds=3, repeats=1, warmup=0)
    assert seen == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert hostclass.paired_speedup([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == 3.0


def figures(tps: float, ttft: float) -> dict[int, dict[str, object]]:
    return {
        n: {
            "aggregate_tps": tps * n, "aggregate_tps_rounds": [tps * n], "stream_tps": tps,
            "ttft_median_s": ttft, "ttft_p95_s": ttft, "ttft_rounds": [ttft],
        }
        for n in (1, 8)
    }  # fmt: skip


def result() -> dict[str, Any]:
    auto, before = "wschat avx2 --dtype auto", "wschat avx2 --dtype fp16-weights"
    by_system = {auto: figures(40.0, 0.2), before: figures(30.0, 0.25), classes.LLAMA: figures(
        50.0, 0.1
    )}  # fmt: skip
    by_system[auto + classes.SAMPLED] = {1: figures(36.0, 0.2)[1]}
    by_system[classes.STATIC] = {8: figures(30.0, 0.125)[8]}
    return {
        "workload": {"threads": 2, "tokens": 64, "rounds": 3},
        "engine": "batched",
        "classes": {
            "avx2": {
                "auto": auto, "before": before,
                "dtype": {auto: "fp16-int8head", before: "fp16-weights"},
                "auto_said": "dtype fp16-int8head: auto: a CPU of the avx2 class",
                "figures": by_system,
                "compared": llamacpp.compare(by_system, against=classes.LLAMA),
                "rss_mb": {auto: 1150.0, before: 1000.0},
            }
        },
    }  # fmt: skip


def test_the_auto_row_is_held_to_llamacpp_and_to_the_row_before() -> None:
    targets = classes.targets(result())
    rows = {row.target: (round(row.ratio or 0, 3), row.met) for row in targets}
    assert rows == {
        "avx2, 1 stream(s): auto agg >= 1.0 x llama.cpp": (0.8, False),
        "avx2, 8 stream(s): auto agg >= 1.3 x llama.cpp": (0.8, False),
        "avx2, 1 stream: auto TTFT <= 1.5 x llama.cpp's": (2.0, False),
        "avx2, 1 stream: default sampling >= 0.95 x greedy": (0.9, False),
        "avx2, 8 sessions: auto TTFT p95 <= 1.2 x the static batch's": (1.6, False),
        "avx2: auto RSS <= 1.1 x fp16-weights's (same streams)": (1.15, False),
    }


def test_rounds_measure_a_system_of_one_count_at_it_alone_in_alternating_order() -> None:
    calls: list[tuple[str, int, int]] = []

    def system(name: str) -> Any:
        def measure(texts: list[str], tokens: int) -> list[StreamTimes]:
            calls.append((name, len(texts), tokens))
            return [StreamTimes(0.0, [0.1 * (i + 1) for i in range(tokens)]) for _ in texts]

        return measure

    work = classes.ClassesWork(tokens=3, streams=(1, 8), rounds=2)
    figures = classes._rounds(work, {"a": system("a"), "b": system("b")}, {"b": 1})
    assert calls[2:] == [
        ("a", 1, 3), ("b", 1, 3), ("a", 8, 3), ("b", 1, 3), ("a", 1, 3), ("a", 8, 3)
    ]  # fmt: skip
    assert calls[:2] == [("a", 8, 4), ("b", 8, 4)]  # the warm-up
    assert (sorted(figures["a"]), sorted(figures["b"])) == ([1, 8], [1])


def test_the_table_names_each_class_system_and_dtype() -> None:
    text = render.text(classes.report(result()))
    assert "avx2: dtype fp16-int8head: auto: a CPU of the avx2 class" in text.splitlines()
    line = next(x for x in text.splitlines() if "--dtype auto" in x and x.rstrip().endswith("MB"))
    assert line.split()[:6] == ["avx2", "wschat", "avx2", "--dtype", "auto", "fp16-int8head"]
    assert "0.800x" in line and "2.000x" in line and "1150.0 MB" in line

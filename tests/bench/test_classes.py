"""The host classes' pure parts: the caps each class sets, the interleaved rounds' ratios, the
classes scenario's targets and table (bench/hostclass.py, bench/classes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import classes, hostclass, llamacpp, render


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
    return {
        "workload": {"threads": 2, "tokens": 64, "rounds": 3},
        "engine": "batched",
        "classes": {
            "avx2": {
                "auto": auto, "before": before,
                "dtype": {auto: "fp16-int8head", before: "fp16-weights"},
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
        "avx2: auto RSS <= 1.1 x fp16-weights's (same streams)": (1.15, False),
    }


def test_the_table_names_each_class_system_and_dtype() -> None:
    text = render.text(classes.report(result()))
    line = next(x for x in text.splitlines() if "--dtype auto" in x and x.rstrip().endswith("MB"))
    assert line.split()[:6] == ["avx2", "wschat", "avx2", "--dtype", "auto", "fp16-int8head"]
    assert "0.800x" in line and "2.000x" in line and "1150.0 MB" in line

"""The busy-neighbour scenario's ratios, targets and table, from figures of our own."""

from __future__ import annotations

from typing import Any

from bench import render, threads

RATES = {  # (one stream tokens/s, 8 sessions aggregate tokens/s) per config and state
    "default": {"quiet": (17.0, 100.0), "busy": (9.8, 40.0)},
    "1 thread": {"quiet": (10.0, 60.0), "busy": (9.5, 50.0)},
    "2 threads": {"quiet": (18.0, 110.0), "busy": (1.1, 12.0)},
    "2, passive": {"quiet": (16.0, 90.0), "busy": (12.0, 60.0)},  # shown, never the best
}


def result() -> dict[str, Any]:
    figures = {
        config: {
            state: {
                1: {"stream_tps": one, "aggregate_tps": one * 0.9},
                8: {"stream_tps": many / 8, "aggregate_tps": many},
            }
            for state, (one, many) in states.items()
        }
        for config, states in RATES.items()
    }
    return {
        "workload": {"tokens": 64, "rounds": 3},
        "engine": "batched",
        "neighbour_core": 1,
        "cores": 2,
        "figures": figures,
        "ratios": threads.ratios(figures),
        "default_threads_seen": {"quiet": [2, 2], "busy": [1, 1]},
    }


def test_each_ratio_is_to_the_best_of_1_and_2_threads_in_its_cell() -> None:
    ratios = result()["ratios"]
    assert ratios["2 threads"]["quiet"] == {1: 1.0, 8: 1.0}
    assert ratios["default"]["quiet"] == {1: 17.0 / 18.0, 8: 100.0 / 110.0}
    assert ratios["1 thread"]["busy"] == {1: 1.0, 8: 1.0}
    assert ratios["default"]["busy"] == {1: 9.8 / 9.5, 8: 40.0 / 50.0}  # it may beat them
    assert ratios["2, passive"]["busy"] == {1: 12.0 / 9.5, 8: 60.0 / 50.0}


def test_a_target_per_cell_says_whether_the_default_is_within_0_9_of_the_best() -> None:
    rows = threads.targets(result())
    assert [(r.target, r.met) for r in rows] == [
        ("threads, quiet, 1 stream: default >= 0.9 x best (2 threads)", True),
        ("threads, quiet, 8 sessions: default >= 0.9 x best (2 threads)", True),
        ("threads, busy, 1 stream: default >= 0.9 x best (1 thread)", True),
        ("threads, busy, 8 sessions: default >= 0.9 x best (1 thread)", False),
    ]
    assert (rows[2].value, rows[2].against) == (9.8, 9.5)
    assert rows[3].ratio == 0.8


def test_the_table_has_a_row_per_config_and_state_and_the_threads_the_default_used() -> None:
    text = render.text(threads.report(result()))
    lines = text.splitlines()
    assert (
        "2 threads   busy                    1.1   0.116x                  12.0   0.240x" in lines
    )
    assert (
        "default     quiet                  17.0   0.944x                 100.0   0.909x" in lines
    )
    assert "threads the default used (read after each measurement): quiet: 2, 2; busy: 1, 1" in (
        lines
    )
    assert sum(": default >= 0.9 x best" in line for line in lines) == 4

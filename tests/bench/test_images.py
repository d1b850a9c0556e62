"""The image-conversation scenario: counters, rates, targets and table from figures of our own."""

from __future__ import annotations

from typing import Any

import pytest

from bench import images, render
from bench.stats import StreamTimes


def reading(steps: int, rows: int, batch: int, generate: int) -> dict[str, Any]:
    """What ``/bench/engine`` answers."""
    turns = {"batch": batch, "generate": generate}
    return {"decode_steps": steps, "decoded_tokens": rows, "image_turns": turns}


def test_the_counters_of_a_turn_are_the_difference_of_two_readings() -> None:
    assert images.counters_delta(reading(10, 50, 1, 2), reading(30, 210, 5, 2)) == {
        "decode_steps": 20,
        "decoded_tokens": 160,
        "image_turns_batch": 4,
        "image_turns_generate": 0,
    }


def stream(sent: float, first: float, last: float, tokens: int) -> StreamTimes:
    step = (last - first) / (tokens - 1)
    return StreamTimes(sent, [first + i * step for i in range(tokens)])


def test_the_rate_of_turns_is_their_tokens_over_the_sum_of_their_spans() -> None:
    one = [stream(0.0, 0.5, 1.0, 10), stream(0.0, 0.4, 2.0, 10)]  # span 2 s
    two = [stream(10.0, 10.5, 12.0, 20)]  # span 2 s; the 8 s between turns do not count
    assert images.phase_rate([one, two]) == pytest.approx(40 / 4.0)


def turn(tokens: int, counters: dict[str, int]) -> dict[str, Any]:
    return {"streams": [stream(0.0, 0.5, 1.0, tokens)], "counters": counters}


def counted(steps: int, rows: int, batch: int, generate: int) -> dict[str, int]:
    return images.counters_delta(reading(0, 0, 0, 0), reading(steps, rows, batch, generate))


def test_a_run_sums_the_counters_of_the_turns_after_the_first_and_their_rows_per_step() -> None:
    run = images.summary(
        [
            turn(4, counted(3, 12, 0, 4)),
            turn(11, counted(10, 80, 4, 0)),
            turn(11, counted(10, 60, 4, 0)),
        ]
    )
    assert run["first_turn"] == counted(3, 12, 0, 4)
    assert run["text_turns"] == counted(20, 140, 8, 0)
    assert run["rows_per_step"] == 7.0
    assert run["text_turns_tps"] == pytest.approx(22 / 2.0)
    assert run["turn_tps"] == [pytest.approx(4.0), pytest.approx(11.0), pytest.approx(11.0)]


def result(later_generate: int = 0, rates: tuple[float, float] = (95.0, 100.0)) -> dict[str, Any]:
    def runs(batch: int, generate: int, rate: float) -> list[dict[str, Any]]:
        return [
            {"first_turn_tps": 50.0, "text_turns_tps": rate, "rows_per_step": 8.0,
             "turn_tps": [50.0, rate],
             "first_turn": counted(3, 24, 0, generate and 4),
             "text_turns": counted(40, 320, batch, generate)}
            for _ in range(3)
        ]  # fmt: skip

    mixed, text = rates
    figures = images.figures({"text": runs(0, 0, text), "images": runs(4, later_generate, mixed)})
    return {
        "workload": {"sessions": 8, "turns": 2, "tokens": 32, "rounds": 3},
        "engine": "batched",
        "model": "tiny-random-vision",
        "figures": figures,
        "text_turns_x": mixed / text,
    }


def test_every_text_turn_after_an_image_in_the_batch_meets_the_target() -> None:
    rows = images.targets(result())
    assert [(r.target, r.met) for r in rows] == [
        ("images: text turns after an image served in the batch (of all)", True),
        ("images: text turns agg tok/s >= 0.9 x all-text", True),
    ]
    assert (rows[0].value, rows[0].against, rows[0].ratio) == (12.0, 12.0, 0.0)


def test_a_text_turn_sent_to_generate_misses_the_target() -> None:
    rows = images.targets(result(later_generate=1, rates=(80.0, 100.0)))
    assert [r.met for r in rows] == [False, False]
    assert rows[0].ratio == 3.0  # one per round


def test_the_table_has_a_row_per_kind_with_its_paths() -> None:
    lines = render.text(images.report(result())).splitlines()
    assert lines[4].split() == [
        "text",
        "50.0",
        "100.0",
        "1.000x",
        "8.00",
        "0",
        "/",
        "0;",
        "0",
        "/",
        "0",
    ]
    assert lines[5].split() == [
        "images",
        "50.0",
        "95.0",
        "0.950x",
        "8.00",
        "0",
        "/",
        "0;",
        "12",
        "/",
        "0",
    ]
    assert lines[6:8] == [
        "text: tokens/s by turn (median over rounds): 50.0, 100.0",
        "images: tokens/s by turn (median over rounds): 50.0, 95.0",
    ]

"""The staggered-arrivals scenario's figures, target and table, from rounds of our own."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench import arrivals
from bench.workload import Workload


def rounds() -> list[dict[str, Any]]:
    """Two rounds of 4 sessions: the first finds the server idle, 3 join while others decode."""
    return [
        {"interval_s": 0.2, "step_s": 0.050, "alone_s": [0.010, 0.060, 0.070, 0.080],
         "ttft_s": [0.500, 0.100, 0.110, 0.120]},
        {"interval_s": 0.2, "step_s": 0.060, "alone_s": [0.010, 0.060, 0.060, 0.060],
         "ttft_s": [0.010, 0.120, 0.150, 0.180]},
    ]  # fmt: skip


def test_figures_leave_out_the_first_session_and_take_the_median_over_rounds() -> None:
    figures = arrivals.figures(rounds())
    # round 1: joiners 100/110/120 ms, alone 70 ms, bound 70 + 50; round 2: 120/150/180, 60 + 60
    assert figures["ttft_median_s"] == pytest.approx((0.110 + 0.150) / 2)
    assert figures["ttft_p95_s"] == pytest.approx((0.120 + 0.180) / 2)
    assert figures["alone_median_s"] == pytest.approx((0.070 + 0.060) / 2)
    assert figures["bound_s"] == pytest.approx((0.120 + 0.120) / 2)
    assert figures["p95_x_bound"] == pytest.approx((0.120 / 0.120 + 0.180 / 0.120) / 2)
    assert figures["p95_x_alone"] == pytest.approx((0.120 / 0.070 + 0.180 / 0.060) / 2)


@pytest.mark.parametrize(("joiner_s", "met"), [(0.143, True), (0.145, False)])
def test_the_target_holds_joiners_to_1_2_x_the_prompt_alone_plus_one_step(
    joiner_s: float, met: bool
) -> None:
    one = [{"interval_s": 0.2, "step_s": 0.050, "alone_s": [0.0, 0.070, 0.070],
            "ttft_s": [0.0, 0.100, joiner_s]}]  # fmt: skip
    (row,) = arrivals.targets(arrivals.figures(one))
    assert row.target == "staggered joiners' TTFT p95 <= 1.2 x (alone + one step)"
    assert (row.value, row.against) == (joiner_s, pytest.approx(0.120))
    assert row.met is met


def test_the_table_says_the_cadence_and_the_joiners_against_the_prompts_alone() -> None:
    work = arrivals.ArrivalsWork(sessions=4, tokens=32, rounds=2)
    result = {"workload": {**dataclasses.asdict(work)}, **arrivals.figures(rounds())}
    assert arrivals.lines(result) == [
        "staggered arrivals: 4 sessions, one more every 4 decode steps of the static batch "
        "(55 ms each), 32 tokens each, median of 2 rounds:",
        "joiners' TTFT median 130 ms, p95 150 ms; the same prompts alone in process 65 ms "
        "(p95 2.357x of it)",
    ]


def test_the_work_follows_the_runs_widest_batch_reply_length_and_rounds() -> None:
    assert arrivals.ArrivalsWork.of(Workload()) == arrivals.ArrivalsWork(8, 64, 4, 3)
    quick = arrivals.ArrivalsWork.of(Workload.quick())
    assert (quick.sessions, quick.tokens, quick.rounds) == (8, 32, 1)

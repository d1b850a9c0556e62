"""The batch-width scenario's FIFO check, figures, targets and table, from frames of our own."""

from __future__ import annotations

from typing import Any

from bench import render, widths
from bench.stats import StreamTimes


def session(
    place: int, start_at: float, queued_ms: float = 0.0
) -> tuple[StreamTimes, dict[str, Any]]:
    """One served session: its place in the queue (0: a slot at once) and when ``start`` came."""
    times = StreamTimes(0.0, [start_at + 0.1, start_at + 0.2])
    positions = [place, *range(place - 1, 0, -1)] if place else []
    return times, {"start_at": start_at, "positions": positions, "queued_ms": queued_ms}


def test_sessions_that_started_in_the_order_they_arrived_have_no_pair_out_of_order() -> None:
    served = [session(0, 0.0), session(0, 0.001), session(1, 1.0), session(2, 1.0), session(3, 2)]
    assert widths.fifo(served) == {"queued": 3, "pairs": 9, "out_of_order": 0, "judged": True}


def test_a_later_arrival_started_first_counts_once_per_earlier_session_it_passed() -> None:
    served = [session(0, 0.0), session(1, 2.0), session(2, 1.0), session(3, 3.0)]
    assert widths.fifo(served)["out_of_order"] == 1  # place 2 before place 1


def test_starts_within_the_tie_are_together_whatever_order_they_came_in() -> None:
    served = [session(1, 1.005), session(2, 1.0), session(3, 0.5)]
    assert widths.fifo(served, tie_s=0.010)["out_of_order"] == 2  # 3 passed 1 and 2; 2 is a tie


def test_places_that_are_not_one_to_k_leave_fifo_unjudged() -> None:
    served = [session(1, 1.0), session(1, 2.0)]  # a slot came free while they arrived
    assert widths.fifo(served)["judged"] is False


def test_queue_waits_are_the_servers_queued_ms_in_seconds() -> None:
    assert widths.queue_waits([session(0, 0.0, 0.5), session(1, 1.0, 1500.0)]) == [0.0005, 1.5]


def cells(aggregates: dict[int, dict[int, list[float]]]) -> dict[int, dict[int, Any]]:
    """Figures per width and session count from each round's aggregate tokens/s."""
    order = {"queued": 4, "pairs": 10, "out_of_order": 0, "judged": True}
    return {
        w: {
            n: {
                "aggregate_tps": sorted(rounds)[len(rounds) // 2],
                "aggregate_tps_rounds": rounds,
                "stream_tps": 10.0,
                "ttft_median_s": 0.2,
                "ttft_p95_s": 0.4,
                "queue_p50_s": 0.0 if n <= w else 1.0,
                "queue_p95_s": 0.0 if n <= w else 2.0,
                "fifo": order if n > w else {**order, "queued": 0, "pairs": 0},
            }
            for n, rounds in by_n.items()
        }
        for w, by_n in aggregates.items()
    }


AGGREGATES = {
    8: {8: [100.0, 90.0, 110.0], 32: [105.0, 99.0, 100.0]},
    32: {8: [100.0, 100.0, 100.0], 32: [150.0, 80.0, 140.0]},
}


def result() -> dict[str, Any]:
    figures = cells(AGGREGATES)
    return {
        "workload": {"tokens": 64, "rounds": 3, "widths": [8, 32], "sessions": [8, 32]},
        "engine": "batched",
        "figures": figures,
        "growth": widths.growth(figures),
        "best_width": widths.best_width(figures),
    }


def test_growth_is_the_median_of_round_by_round_ratios_of_most_to_fewest_sessions() -> None:
    growth = widths.growth(cells(AGGREGATES))
    assert growth == {8: 1.05, 32: 1.4}  # 8: 1.05, 1.1, 0.909...; 32: 1.5, 0.8, 1.4


def test_the_best_width_per_session_count_has_the_highest_aggregate() -> None:
    assert widths.best_width(cells(AGGREGATES)) == {8: 8, 32: 32}  # ties keep the first


def test_a_target_per_width_for_no_collapse_and_one_for_fifo() -> None:
    rows = widths.targets(result())
    assert [(r.target, r.met) for r in rows] == [
        ("width 8: 32 sessions agg >= 1.0 x 8 sessions", True),
        ("width 32: 32 sessions agg >= 1.0 x 8 sessions", True),
        ("widths: queued sessions start in arrival order (pairs out of order)", True),
    ]
    assert (rows[2].value, rows[2].against) == (0.0, 10.0)


def test_fifo_is_unjudged_when_any_cell_was() -> None:
    data = result()
    data["figures"][8][32]["fifo"]["judged"] = False
    assert widths.targets(data)[-1].met is None


def test_the_table_has_a_row_per_width_and_session_count_with_its_queue_and_fifo() -> None:
    lines = render.text(widths.report(result())).splitlines()
    assert (
        "     8       32      100.0   0.714x          10.0    200 ms    400 ms    1000 ms"
        "    2000 ms       0 of 10" in lines
    )
    assert (
        "    32        8      100.0   1.000x          10.0    200 ms    400 ms       0 ms"
        "       0 ms   none queued" in lines
    )
    assert "best width by sessions: 8: 8, 32: 32" in lines

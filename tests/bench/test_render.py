"""bench/figures.py and bench/render.py: targets judged against their limits, and every table,
figure and target printed one way."""

from __future__ import annotations

import pytest

from bench import render
from bench.figures import Column, Limit, Section, Table, Target, Unit, above, at_least, at_most


def target(ratio: float | None, limit: float = 0.95) -> Target:
    return Target.judged(
        "one stream tokens/s >= 0.95 x in-process",
        value=25.0,
        against=27.0,
        ratio=ratio,
        limit=at_least(limit),
    )


@pytest.mark.parametrize(
    ("limit", "ratio", "met"),
    [
        (at_least(0.95), 0.95, True),
        (at_least(0.95), 0.949, False),
        (at_most(1.2), 1.2, True),
        (at_most(1.2), 1.21, False),
        (above(1.0), 1.0, False),
        (above(1.0), 1.01, True),
        (at_most(0.015, "ms"), float("nan"), False),  # a figure that could not be computed
    ],
)
def test_a_target_is_met_within_its_limit_and_missed_past_it(
    limit: Limit, ratio: float, met: bool
) -> None:
    judged = Target.judged("t", value=1.0, against=1.0, ratio=ratio, limit=limit)
    assert judged.met is met
    assert (judged.op, judged.limit, judged.ratio_unit) == (limit.op, limit.limit, limit.unit)


def test_a_target_with_nothing_to_judge_is_neither_met_nor_missed() -> None:
    assert target(None).met is None


def test_a_target_is_written_with_the_keys_of_the_results_files() -> None:
    assert target(0.926).as_json() == {
        "target": "one stream tokens/s >= 0.95 x in-process",
        "value": 25.0,
        "against": 27.0,
        "unit": "",
        "ratio": 0.926,
        "ratio_unit": "x",
        "limit": 0.95,
        "op": ">=",
        "met": False,
    }


def test_a_missed_target_is_printed_as_missed_beside_a_met_one_and_an_unjudged_one() -> None:
    lines = render.text(Section([], [target(0.97), target(0.926), target(None)])).splitlines()
    assert lines == [
        "target                                                            measured     against"
        "  ratio/diff  met",
        "-" * 103,
        "one stream tokens/s >= 0.95 x in-process                              25.0        27.0"
        "      0.970x  yes",
        "one stream tokens/s >= 0.95 x in-process                              25.0        27.0"
        "      0.926x  NO",
        "one stream tokens/s >= 0.95 x in-process                              25.0        27.0"
        "           -  -",
    ]


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.0534, "ms", "53 ms"),
        (0.9264, "x", "0.926x"),
        (1959.04, "MB", "1959.0 MB"),
        (8, "n", "8"),
        (8.004, ".2f", "8.00"),
        (26.04, "", "26.0"),
        (0.05, "s", "0.1"),  # the openai scenario's TTFT targets, in seconds
        (None, "ms", "-"),
        (float("nan"), "x", "-"),
    ],
)
def test_a_figure_prints_in_its_unit(value: float | None, unit: Unit, text: str) -> None:
    assert render.figure(value, unit) == text


def test_a_table_pads_each_cell_to_its_column_under_a_rule_and_keeps_a_line_of_its_own() -> None:
    table = Table(
        (Column("system", 10, left=True), Column("streams", 8, "n"), Column("TTFT", 8, "ms"))
    )
    table.add("ceiling", 8, 0.094)
    table.add("wschat", 1, None)
    table.line("peer      failed: RuntimeError()")
    assert render.table_lines(table) == [
        "system     streams    TTFT",
        "--------------------------",
        "ceiling          8   94 ms",
        "wschat           1       -",
        "peer      failed: RuntimeError()",
    ]


def test_a_row_of_the_wrong_width_is_refused() -> None:
    table = Table((Column("system", 10, left=True), Column("streams", 8, "n")))
    with pytest.raises(ValueError, match=r"^3 cells for 2 columns$"):
        table.add("ceiling", 8, 0.094)


def test_sections_print_a_blank_line_apart_and_their_targets_together_last() -> None:
    first = Section(["main run"], [target(0.97)])
    second = Section(["threads"], [target(0.926)])
    blocks = render.text(first, second).split("\n\n")
    assert blocks[:2] == ["main run", "threads"]
    assert [line.split()[-1] for line in blocks[2].splitlines()[2:]] == ["yes", "NO"]


def test_a_section_without_targets_prints_no_target_head() -> None:
    assert render.text(Section(["a line", ""])) == "a line\n"


def test_a_markdown_table_has_a_head_a_rule_and_its_notes_after() -> None:
    table = Table((Column("library", 0), Column("setup", 0, "ms")))
    table.add("llguidance 1.9.1", 0.0268)
    table.line("")
    table.line("decode step: 1 row 135 ms")
    assert render.markdown(table).splitlines() == [
        "| library | setup |",
        "|---|---|",
        "| llguidance 1.9.1 | 27 ms |",
        "",
        "decode step: 1 row 135 ms",
    ]

"""Sections as text (bench/figures.py): every table, figure and target printed one way."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .figures import Cell, Column, Section, Table, Target, Unit

TARGET_HEAD = f"{'target':<62}{'measured':>12}{'against':>12}{'ratio/diff':>12}  met"
MET = {True: "yes", False: "NO", None: "-"}


def figure(value: float | None, unit: Unit = "") -> str:
    """``value`` in ``unit`` (figures.Unit); "-" when it is missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ms":
        return f"{value * 1000:.0f} ms"
    if unit == "x":
        return f"{value:.3f}x"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "n":
        return f"{value:.0f}"
    if unit == ".2f":
        return f"{value:.2f}"
    return f"{value:.1f}"


def _cell(value: Cell, column: Column) -> str:
    text = value if isinstance(value, str) else figure(value, column.unit)
    return text.ljust(column.width) if column.left else text.rjust(column.width)


def table_lines(table: Table) -> list[str]:
    """The head, a rule under it, and the rows in their columns."""
    head = "".join(_cell(c.head, c) for c in table.columns)
    lines = [head, "-" * len(head)]
    for row in table.rows:
        if isinstance(row, str):
            lines.append(row)
        else:
            lines.append("".join(_cell(v, c) for v, c in zip(row, table.columns, strict=True)))
    return lines


def markdown(table: Table) -> str:
    """``table`` as a Markdown table (the docs quote it); a line of its own follows it."""
    heads = [c.head for c in table.columns]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    notes = []
    for row in table.rows:
        if isinstance(row, str):
            notes.append(row)
        else:
            cells = (
                v if isinstance(v, str) else figure(v, c.unit)
                for v, c in zip(row, table.columns, strict=True)
            )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, *notes])


def target_lines(targets: Sequence[Target]) -> list[str]:
    """Each target: what was measured, against what, the ratio or difference, and met or not."""
    lines = [TARGET_HEAD, "-" * len(TARGET_HEAD)]
    for t in targets:
        lines.append(
            f"{t.target:<62}{figure(t.value, t.unit):>12}{figure(t.against, t.unit):>12}"
            f"{figure(t.ratio, t.ratio_unit):>12}  {MET[t.met]}"
        )
    return lines


def section_lines(section: Section) -> list[str]:
    return [
        line
        for part in section.parts
        for line in (table_lines(part) if isinstance(part, Table) else [part])
    ]


def text(*sections: Section) -> str:
    """The sections, a blank line between them, then all their targets."""
    blocks = ["\n".join(section_lines(s)) for s in sections if s.parts]
    targets = [t for s in sections for t in s.targets]
    if targets:
        blocks.append("\n".join(target_lines(targets)))
    return "\n\n".join(blocks)

"""What a scenario reports, typed: its tables, its lines of text and its targets (met or
missed). Every scenario builds a ``Section``; bench/render.py prints every one the same way.

A scenario module has ``run(work, logs, engine) -> dict`` (its figures, as its results file
holds them), ``targets(result) -> list[Target]`` and ``report(result) -> Section`` (its text,
tables and those targets); bench/__main__.py names it in ``SCENARIOS`` with
``Scenario.of(module, WorkClass, help)``, and writes the targets' rows (``Target.as_json``) to
the results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

# How a figure prints (render.figure): "ms" seconds as milliseconds, "x" a ratio to three
# decimals, "MB" megabytes, "n" a count, ".2f" two decimals; any other (tokens/s, and the
# openai scenario's "s", "tok" and "tok/s") one decimal.
Unit = Literal["", "ms", "x", "MB", "n", ".2f", "s", "tok", "tok/s"]
Op = Literal[">=", "<=", ">", "=="]
Cell = str | float | None  # a str prints as it is, a number (or None) in its column's unit


@dataclass(frozen=True, slots=True)
class Limit:
    """What a target's ratio or difference (in ``unit``) must be: ``op limit``."""

    op: Op
    limit: float
    unit: Unit = "x"

    def judge(self, ratio: float | None) -> bool | None:
        """Whether ``ratio`` is within; None where nothing was measured to judge."""
        if ratio is None:
            return None
        return {
            ">=": ratio >= self.limit,
            "<=": ratio <= self.limit,
            ">": ratio > self.limit,
            "==": ratio == self.limit,
        }[self.op]


def at_least(limit: float, unit: Unit = "x") -> Limit:
    return Limit(">=", limit, unit)


def at_most(limit: float, unit: Unit = "x") -> Limit:
    return Limit("<=", limit, unit)


def above(limit: float, unit: Unit = "x") -> Limit:
    return Limit(">", limit, unit)


@dataclass(frozen=True, slots=True)
class Target:
    """One target: what was measured (``value``) against what (``against``), both in ``unit``;
    the ratio or difference judged (in ``ratio_unit``) against ``limit`` by ``op``, and whether
    it is met (None: not judged). Its fields are the keys of the results' "targets" rows."""

    target: str
    value: float | None
    against: float | None
    unit: Unit
    ratio: float | None
    ratio_unit: Unit
    limit: float
    op: Op
    met: bool | None

    @classmethod
    def judged(
        cls,
        target: str,
        *,
        value: float | None,
        against: float | None,
        ratio: float | None,
        limit: Limit,
        unit: Unit = "",
    ) -> Target:
        """The target, met where ``ratio`` is within ``limit``."""
        return cls(
            target,
            value,
            against,
            unit,
            ratio,
            limit.unit,
            limit.limit,
            limit.op,
            limit.judge(ratio),
        )

    @classmethod
    def over(
        cls, target: str, *, value: float, against: float, limit: Limit, unit: Unit = ""
    ) -> Target:
        """The target judged on ``value / against``."""
        ratio = value / against
        return cls.judged(target, value=value, against=against, ratio=ratio, limit=limit, unit=unit)

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Column:
    head: str
    width: int  # the head and every cell padded to it; columns are not separated otherwise
    unit: Unit = ""  # how a number in this column prints
    left: bool = False  # names align left, figures right


@dataclass(slots=True)
class Table:
    """Rows under a head; a row is one cell per column, or a line of its own (a failure, a
    note) among them."""

    columns: tuple[Column, ...]
    rows: list[tuple[Cell, ...] | str] = field(default_factory=list)

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)

    def line(self, text: str) -> None:
        self.rows.append(text)


@dataclass(slots=True)
class Section:
    """What one scenario prints: lines of text and tables in order, then its targets."""

    parts: list[str | Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    def extend(self, other: Section) -> None:
        """``other``'s parts and targets after this one's, as one section."""
        self.parts += other.parts
        self.targets += other.targets

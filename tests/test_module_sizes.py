"""Modules stay small enough to read whole: a big one is split rather than grown.

- ``Session`` (sessions/session.py), which every door drives, stays under 300 lines: its rules
  live in its core (core.py), each kind of turn in turns.py, persistence in snapshot.py;
- no module outside ``bench/`` (the packages' and the tests') is over 450 lines, but for those
  ``LONG_MODULES_LEFT`` names, each with its lines when it was named and why it is left. The list
  only shrinks: a module named there that grows fails, and so does one back within the limit
  until its entry goes. The bench's scripts, experiments each whole in one file, are not held
  to it.
"""

from __future__ import annotations

from pathlib import Path

from .import_graph import our_modules, source_modules, within

SESSION = "wschat.server.sessions.session"
MAX_SESSION_LINES = 300
MAX_MODULE_LINES = 450
NOT_HELD = ("bench",)  # packages whose modules may be longer
# module -> (its lines when it was named here, why it is left over the limit)
LONG_MODULES_LEFT: dict[str, tuple[int, str]] = {}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_modules(modules: dict[str, Path], most: int = MAX_MODULE_LINES) -> dict[str, int]:
    """Each module over ``most`` lines, with its lines, but those of ``NOT_HELD``."""
    held = {m: path for m, path in modules.items() if not any(within(m, p) for p in NOT_HELD)}
    return {m: n for m, path in held.items() if (n := lines(path)) > most}


def wrongly_left(long: dict[str, int], left: dict[str, tuple[int, str]]) -> list[str]:
    """The modules ``left`` names that have grown since, or are no longer long."""
    return sorted(m for m, (named_at, _) in left.items() if not 0 < long.get(m, 0) <= named_at)


def test_the_session_module_is_under_300_lines() -> None:
    assert lines(our_modules()[SESSION]) < MAX_SESSION_LINES


def test_no_module_outside_the_bench_is_over_450_lines_but_those_left() -> None:
    long = long_modules(source_modules())
    assert {m: n for m, n in long.items() if m not in LONG_MODULES_LEFT} == {}


def test_a_module_left_long_has_not_grown_nor_come_back_within_the_limit() -> None:
    assert wrongly_left(long_modules(source_modules()), LONG_MODULES_LEFT) == []


def test_the_size_check_sees_a_module_over_the_limit_outside_the_bench(tmp_path: Path) -> None:
    sizes = {
        "wschat.pkg.short": MAX_MODULE_LINES,
        "wschat.pkg.long": MAX_MODULE_LINES + 1,
        "tests.pkg.test_long": MAX_MODULE_LINES + 20,
        "bench.long": MAX_MODULE_LINES * 3,
    }
    modules = {name: tmp_path / f"{name}.py" for name in sizes}
    for name, n in sizes.items():
        modules[name].write_text("x = 1\n" * n)
    assert long_modules(modules) == {
        "wschat.pkg.long": MAX_MODULE_LINES + 1,
        "tests.pkg.test_long": MAX_MODULE_LINES + 20,
    }


def test_the_list_of_modules_left_long_only_shrinks() -> None:
    long = {"pkg.same": 500, "pkg.shorter": 480, "pkg.grown": 520}
    named = ("pkg.same", "pkg.shorter", "pkg.grown", "pkg.split")
    left = {name: (500, "planted") for name in named}
    assert wrongly_left(long, left) == ["pkg.grown", "pkg.split"]

"""Modules stay small enough to read whole: a big one is split rather than grown.

- ``Session`` (sessions/session.py), which every door drives, stays under 300 lines: its rules
  live in its core (core.py), each kind of turn in turns.py, persistence in snapshot.py;
- no module outside ``bench/`` (the packages' and the tests') is over 450 lines, but for those
  ``LONG_MODULES_LEFT`` names, each with its lines when it was named and why it is left. The list
  only shrinks: a module named there that grows fails, and so does one back within the limit
  until its entry goes. The bench's scripts, experiments each whole in one file, are not held
  to it;
- nor is any of the pages' own scripts (``server/web/static/``, ``.js`` and ``.mjs``); the
  libraries vendored as published (``static/vendor/``) are not ours to split.
"""

from __future__ import annotations

from pathlib import Path

from .import_graph import ROOT, our_modules, source_modules, within

SESSION = "wschat.server.sessions.session"
MAX_SESSION_LINES = 300
MAX_MODULE_LINES = 450
NOT_HELD = ("bench",)  # packages whose modules may be longer
STATIC = ROOT / "server" / "web" / "static"
VENDORED = "vendor"  # the folder of static/ that holds other projects' files as published
SCRIPTS = (".js", ".mjs")
# module -> (its lines when it was named here, why it is left over the limit)
LONG_MODULES_LEFT: dict[str, tuple[int, str]] = {}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def page_scripts(static: Path = STATIC) -> dict[str, Path]:
    """The pages' own scripts under ``static``, by their path there, but the vendored ones."""
    return {
        str(path.relative_to(static)): path
        for path in sorted(static.rglob("*"))
        if path.suffix in SCRIPTS and path.relative_to(static).parts[0] != VENDORED
    }


def long_modules(modules: dict[str, Path], most: int = MAX_MODULE_LINES) -> dict[str, int]:
    """Each module over ``most`` lines, with its lines, but those of ``NOT_HELD``."""
    held = {m: path for m, path in modules.items() if not any(within(m, p) for p in NOT_HELD)}
    return {m: n for m, path in held.items() if (n := lines(path)) > most}


def wrongly_left(long: dict[str, int], left: dict[str, tuple[int, str]]) -> list[str]:
    """The modules ``left`` names that have grown since, or are no longer long."""
    return sorted(m for m, (named_at, _) in left.items() if not 0 < long.get(m, 0) <= named_at)


def planted(folder: Path, sizes: dict[str, int], suffix: str = "") -> dict[str, Path]:
    """A file of ``n`` lines at ``folder/<name><suffix>`` for each name of ``sizes``, by name."""
    paths = {name: folder / f"{name}{suffix}" for name in sizes}
    for name, n in sizes.items():
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_text("x = 1\n" * n)
    return paths


def test_the_session_module_is_under_300_lines() -> None:
    assert lines(our_modules()[SESSION]) < MAX_SESSION_LINES


def test_no_module_outside_the_bench_is_over_450_lines_but_those_left() -> None:
    long = long_modules(source_modules())
    assert {m: n for m, n in long.items() if m not in LONG_MODULES_LEFT} == {}


def test_no_script_of_the_pages_is_over_450_lines() -> None:
    assert long_modules(page_scripts()) == {}


def test_the_size_check_holds_the_pages_scripts_but_the_vendored_ones(tmp_path: Path) -> None:
    sizes = {
        "short.js": MAX_MODULE_LINES,
        "long.js": MAX_MODULE_LINES + 1,
        "codec/long.mjs": MAX_MODULE_LINES + 2,
        "style.css": MAX_MODULE_LINES * 2,
        "vendor/library.min.js": MAX_MODULE_LINES * 3,
        "vendor/library/Decoder.mjs": MAX_MODULE_LINES * 3,
    }
    planted(tmp_path, sizes)
    assert long_modules(page_scripts(tmp_path)) == {
        "long.js": MAX_MODULE_LINES + 1,
        "codec/long.mjs": MAX_MODULE_LINES + 2,
    }


def test_a_module_left_long_has_not_grown_nor_come_back_within_the_limit() -> None:
    assert wrongly_left(long_modules(source_modules()), LONG_MODULES_LEFT) == []


def test_the_size_check_sees_a_module_over_the_limit_outside_the_bench(tmp_path: Path) -> None:
    sizes = {
        "wschat.pkg.short": MAX_MODULE_LINES,
        "wschat.pkg.long": MAX_MODULE_LINES + 1,
        "tests.pkg.test_long": MAX_MODULE_LINES + 20,
        "bench.long": MAX_MODULE_LINES * 3,
    }
    assert long_modules(planted(tmp_path, sizes, ".py")) == {
        "wschat.pkg.long": MAX_MODULE_LINES + 1,
        "tests.pkg.test_long": MAX_MODULE_LINES + 20,
    }


def test_the_list_of_modules_left_long_only_shrinks() -> None:
    long = {"pkg.same": 500, "pkg.shorter": 480, "pkg.grown": 520}
    named = ("pkg.same", "pkg.shorter", "pkg.grown", "pkg.split")
    left = {name: (500, "planted") for name in named}
    assert wrongly_left(long, left) == ["pkg.grown", "pkg.split"]

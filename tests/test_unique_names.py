"""Each class name of the server and the protocol means one thing: an engine's error and the wire
error it becomes (``sessions/error_boundary.py``) are told apart by name, not by the module they
were imported from. (The Python client is a package of its own, named for its users.) And each
public function of the engine is written once: ``engine/local`` and ``engine/openai`` never
import each other (tests/test_interfaces.py), so what both need lives below them, in
``engine/``, rather than copied into each."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("protocol", "server")
ENGINE = ("server/engine",)
NAMED = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def defined_twice(
    folders: tuple[str, ...], kinds: tuple[type[ast.stmt], ...]
) -> dict[str, list[str]]:
    """Each top-level name of ``kinds`` that two modules under ``folders`` define, with them."""
    defined: dict[str, list[str]] = defaultdict(list)
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, NAMED) and isinstance(node, kinds):
                    defined[node.name].append(str(path.relative_to(ROOT)))
    return {name: paths for name, paths in defined.items() if len(paths) > 1}


def test_no_two_classes_of_the_server_and_protocol_share_a_name() -> None:
    assert defined_twice(FOLDERS, (ast.ClassDef,)) == {}


def test_no_public_function_of_the_engine_is_defined_twice() -> None:
    functions = defined_twice(ENGINE, (ast.FunctionDef, ast.AsyncFunctionDef))
    assert {name: paths for name, paths in functions.items() if not name.startswith("_")} == {}


def assigned_strings(folders: tuple[str, ...], value: str) -> list[str]:
    """Each module under ``folders`` that assigns the string ``value`` to a top-level name."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if not isinstance(node, ast.Assign | ast.AnnAssign):
                    continue
                if isinstance(node.value, ast.Constant) and node.value.value == value:
                    found.append(str(path.relative_to(ROOT)))
    return found


def test_the_embedded_model_name_is_defined_once_in_engine_embedded() -> None:
    assert assigned_strings(FOLDERS, "embedded") == ["server/engine/embedded.py"]

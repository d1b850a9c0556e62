"""Each class name of the server and the protocol means one thing: an engine's error and the wire
error it becomes (``sessions/error_boundary.py``) are told apart by name, not by the module they
were imported from. (The Python client is a package of its own, named for its users.)"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("protocol", "server")


def test_no_two_classes_of_the_server_and_protocol_share_a_name() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef):
                    defined[node.name].append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in defined.items() if len(paths) > 1}
    assert shared == {}

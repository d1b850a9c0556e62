"""Layers import downward only (STYLE.md 17), read from the source with ``ast``: every import
statement counts, at module level or inside a function, so a lazy import cannot slip past.

- ``wschat.protocol`` imports nothing of ours and nothing but the stdlib and msgpack;
- the server is four layers, each importing only its own and the ones below it:
  ``engine`` <- ``sessions`` <- ``web`` <- ``runtime`` (and ``protocol`` under them all);
  ``wschat.server.settings``, a plain dataclass, is shared by the three upper layers and imports
  nothing of ours; the engine imports nothing else of the server, settings included; nothing in
  ``engine``, ``sessions`` or ``web`` imports ``runtime``;
- no module of the packages imports the tests (their fakes stay out of production);
- torch and transformers are imported only in ``wschat.server.engine.local``: the engine
  interface and the conversation as token ids serve engines without them;
- ``wschat.client`` imports nothing from ``wschat.server``;
- no two modules, in the packages, the tests and the bench, import each other at run time (an
  import under ``if TYPE_CHECKING:`` never runs).

The interfaces between and within the layers are ``test_interfaces.py``'s rules; what a module
may read of another, ``test_private_names.py``'s; who may set a session's attributes,
``test_outside_writes.py``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .import_graph import (
    Edge,
    import_graph,
    imports_of,
    our_modules,
    package_dirs,
    source_modules,
    within,
)
from .layers import CLIENT, ENGINE, LAYERS, LOCAL_ENGINES, RUNTIME, SERVER, SETTINGS
from .wire_errors import PROTOCOL

HEAVY = ("torch", "transformers")
# the package itself and ``python -m wschat.server``, which starts the top layer
OUTSIDE_LAYERS = frozenset({SERVER, f"{SERVER}.__main__", SETTINGS})
PROTOCOL_MAY_IMPORT = frozenset(sys.stdlib_module_names) | {"msgpack"}


def test_the_reader_sees_absolute_relative_lazy_and_submodule_imports(tmp_path: Path) -> None:
    source = tmp_path / "hf.py"
    source.write_text(
        "import os.path\n"
        "from wschat.protocol import Done\n"
        "from ..loader import LoadedModel\n"
        "from . import base\n"
        "from .rows import Rows\n"
        "def later() -> None:\n"
        "    from ...client import connect\n"
    )
    known = {"wschat.server.engine.base"}
    assert sorted(imports_of("wschat.server.engine.hf", source, known)) == [
        "os.path",
        "wschat.client",
        "wschat.protocol",
        "wschat.server.engine.base",
        "wschat.server.engine.rows",
        "wschat.server.loader",
    ]
    init = tmp_path / "__init__.py"
    init.write_text("from .base import Engine\n")
    assert list(imports_of("wschat.server.engine", init, known)) == ["wschat.server.engine.base"]


def test_the_graph_covers_every_package() -> None:
    importers = {m for m, _ in import_graph()}
    for package in package_dirs():
        assert any(within(m, package) for m in importers), package


def test_protocol_imports_only_the_stdlib_msgpack_and_itself() -> None:
    bad = sorted(
        (m, target)
        for m, target in import_graph()
        if within(m, PROTOCOL)
        and not within(target, PROTOCOL)
        and target.split(".")[0] not in PROTOCOL_MAY_IMPORT
    )
    assert bad == []


def test_the_engine_imports_nothing_else_from_the_server() -> None:
    bad = sorted(
        (m, target)
        for m, target in import_graph()
        if within(m, ENGINE) and within(target, SERVER) and not within(target, ENGINE)
    )
    assert bad == []


def test_only_the_local_engines_import_torch_or_transformers() -> None:
    bad = sorted(
        (m, target)
        for m, target in import_graph()
        if within(m, SERVER)
        and not within(m, LOCAL_ENGINES)
        and any(within(target, heavy) for heavy in HEAVY)
    )
    assert bad == []


def test_the_client_imports_nothing_from_the_server() -> None:
    bad = sorted(
        (m, target) for m, target in import_graph() if within(m, CLIENT) and within(target, SERVER)
    )
    assert bad == []


def layer_of(module: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if within(module, layer)), None)


def test_every_server_module_sits_in_a_layer() -> None:
    strays = sorted(m for m in our_modules() if within(m, SERVER) and layer_of(m) is None)
    assert strays == sorted(OUTSIDE_LAYERS)


def may_import(module: str, target: str) -> bool:
    """Whether a server module may import ``target`` by the layer order."""
    mine, theirs = layer_of(module), layer_of(target)
    if mine is None or not within(target, SERVER) or target == SERVER:
        return True
    if target == SETTINGS:
        return mine > 0  # the engine is configured by its constructors' arguments
    return theirs is not None and theirs <= mine


def test_each_server_layer_imports_only_itself_the_layers_below_and_settings() -> None:
    bad = sorted((m, target) for m, target in import_graph() if not may_import(m, target))
    assert bad == []


def test_settings_import_nothing_of_ours() -> None:
    ours = [*package_dirs(), "tests"]
    bad = sorted(
        (m, target)
        for m, target in import_graph()
        if m == SETTINGS and any(within(target, package) for package in ours)
    )
    assert bad == []


def test_no_layer_under_the_runtime_imports_it() -> None:
    """The process (cli, uvicorn, the drain) is the top: the engine, sessions and web are built
    and handed what they need, so each runs without a server process (as the tests run them)."""
    bad = sorted(
        (m, target)
        for m, target in import_graph()
        if any(within(m, layer) for layer in LAYERS[: LAYERS.index(RUNTIME)])
        and within(target, RUNTIME)
    )
    assert bad == []


def test_the_layering_check_refuses_an_upward_import(tmp_path: Path) -> None:
    """The check above is not vacuous: a session module importing the web layer is an edge the
    graph reader sees and the layer order refuses."""
    source = tmp_path / "hub.py"
    source.write_text("from ..web.stats_feed import StatsFeed\n")
    (target,) = imports_of(f"{SERVER}.sessions.hub", source, set())
    assert target == f"{SERVER}.web.stats_feed"
    assert not may_import(f"{SERVER}.sessions.hub", target)
    assert not may_import(f"{SERVER}.engine.base", SETTINGS)
    assert may_import(f"{SERVER}.runtime.serve", target)


def test_no_package_module_imports_the_tests() -> None:
    bad = sorted((m, target) for m, target in import_graph() if within(target, "tests"))
    assert bad == []


def circles(edges: set[Edge]) -> set[Edge]:
    """Each pair of modules that import each other, once (in name order)."""
    return {(a, b) for a, b in edges if a < b and (b, a) in edges}


def test_no_two_modules_import_each_other_at_run_time() -> None:
    assert circles(import_graph(source_modules(), typing=False)) == set()


def test_the_circle_check_sees_a_circle_and_not_a_typing_only_one(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from . import c\n"
    )
    for name in "bc":
        (tmp_path / f"{name}.py").write_text("from . import a\n")
    modules = {f"pkg.{name}": tmp_path / f"{name}.py" for name in "abc"}
    assert circles(import_graph(modules, typing=False)) == {("pkg.a", "pkg.b")}
    assert circles(import_graph(modules)) == {("pkg.a", "pkg.b"), ("pkg.a", "pkg.c")}

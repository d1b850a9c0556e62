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
- ``wschat.client`` imports nothing from ``wschat.server``.

Interfaces, not only layers:

- outside ``engine/`` and ``runtime/`` (which builds the engines), the engine is imported only as
  ``wschat.server.engine``, the package's ``__init__``: sessions and web see the ``Engine``
  interface and the engine's errors, never a module that implements them;
- ``engine.local`` (torch in this process) and ``engine.openai`` (a server over HTTP) never
  import each other: each is an engine of its own over the interface;
- the engine imports no wire errors. A wire error is whatever names a wire error code: the
  module ``wschat.protocol.errors`` (imported itself or any name from it, e.g. ``TooLarge``,
  ``ProtocolError``, ``SessionMisuse``), every name it defines however it is imported (``from
  wschat.protocol import Overloaded``, ``protocol.Overloaded`` on an imported protocol module),
  ``ErrorCode`` and the ``Error`` frame. An engine's failure is a class of
  ``engine/errors.py``; ``sessions/error_boundary.py`` gives it its code.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = "wschat.protocol"
SERVER = "wschat.server"
ENGINE = "wschat.server.engine"
LOCAL_ENGINES = "wschat.server.engine.local"
OPENAI_ENGINE = "wschat.server.engine.openai"
HEAVY = ("torch", "transformers")
CLIENT = "wschat.client"
# bottom to top: a layer may import its own modules and those of the layers before it
LAYERS = tuple(f"{SERVER}.{name}" for name in ("engine", "sessions", "web", "runtime"))
SETTINGS = f"{SERVER}.settings"
RUNTIME = f"{SERVER}.runtime"
PROTOCOL_ERRORS = f"{PROTOCOL}.errors"
# the package itself and ``python -m wschat.server``, which starts the top layer
OUTSIDE_LAYERS = frozenset({SERVER, f"{SERVER}.__main__", SETTINGS})
PROTOCOL_MAY_IMPORT = frozenset(sys.stdlib_module_names) | {"msgpack"}


Edge = tuple[str, str]


def package_dirs() -> dict[str, Path]:
    """``wschat.protocol`` -> ``protocol/``, ...: the mapping the package is installed with."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = project["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def our_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imported_from(package: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``from ... import`` reads, from within ``package``."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*anchor, base] if base else anchor)


def imports_of(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """The absolute name of each module that ``module`` (the file ``path``) imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                # ``from . import loader`` imports the submodule, not the package
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in known else base


def import_graph() -> set[Edge]:
    modules = our_modules()
    known = set(modules)
    return {(m, target) for m, path in modules.items() for target in imports_of(m, path, known)}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


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


# -- interfaces ---------------------------------------------------------------------------


def reaches_into_the_engine(module: str, target: str) -> bool:
    """Whether ``module`` imports a module of the engine other than its package: allowed only
    inside the engine and in the runtime (which builds the engines)."""
    return (
        within(target, ENGINE)
        and target != ENGINE
        and not within(module, ENGINE)
        and not within(module, RUNTIME)
    )


def crosses_engines(module: str, target: str) -> bool:
    """Whether one of ``engine.local`` and ``engine.openai`` imports the other."""
    pair = (LOCAL_ENGINES, OPENAI_ENGINE)
    return any(within(module, a) and within(target, b) for a, b in (pair, pair[::-1]))


def wire_error_names() -> frozenset[str]:
    """Every name ``protocol/errors.py`` defines at its top level, with ``ErrorCode`` and the
    ``Error`` frame: what names a wire error code."""
    tree = ast.parse(package_dirs()[PROTOCOL].joinpath("errors.py").read_text())
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }
    defined |= {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return frozenset(defined | {"ErrorCode", "Error"})


def is_wire_error(name: str, wire_names: frozenset[str]) -> bool:
    """Whether the dotted ``name`` (a module, or a module's attribute) is a wire error."""
    module, _, attribute = name.rpartition(".")
    return within(name, PROTOCOL_ERRORS) or (within(module, PROTOCOL) and attribute in wire_names)


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def wire_errors_in(
    module: str, path: Path, known: set[str], wire_names: frozenset[str]
) -> Iterator[str]:
    """The wire errors ``module`` imports, by name (``from wschat.protocol import TooLarge``)
    or as an attribute of a protocol module it imported (``protocol.ErrorCode``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    bound: dict[str, str] = {}  # a local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    first = alias.name.split(".")[0]
                    bound[first] = first
                if is_wire_error(alias.name, wire_names):
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if name in known or within(name, PROTOCOL_ERRORS):
                    bound[alias.asname or alias.name] = name
                if is_wire_error(name, wire_names):
                    yield name
    for node in ast.walk(tree):
        chain = dotted(node) if isinstance(node, ast.Attribute) else None
        if chain is None:
            continue
        first, _, rest = chain.partition(".")
        name = f"{bound[first]}.{rest}" if first in bound else ""
        if name and is_wire_error(name, wire_names):
            yield name


def test_outside_the_engine_and_runtime_only_the_engine_package_is_imported() -> None:
    bad = sorted(edge for edge in import_graph() if reaches_into_the_engine(*edge))
    assert bad == []


def test_the_local_and_openai_engines_never_import_each_other() -> None:
    bad = sorted(edge for edge in import_graph() if crosses_engines(*edge))
    assert bad == []


def test_the_engine_imports_no_wire_errors() -> None:
    modules = our_modules()
    known, wire_names = set(modules), wire_error_names()
    bad = sorted(
        (m, name)
        for m, path in modules.items()
        if within(m, ENGINE)
        for name in wire_errors_in(m, path, known, wire_names)
    )
    assert bad == []


@pytest.mark.parametrize(
    ("rule", "module", "target", "refused"),
    [
        # the violations these rules were written against
        (reaches_into_the_engine, f"{SERVER}.sessions.session", f"{ENGINE}.local.hf", True),
        (reaches_into_the_engine, f"{SERVER}.sessions.session", f"{ENGINE}.openai.engine", True),
        (crosses_engines, f"{ENGINE}.openai.client", f"{ENGINE}.local.hf", True),
        # and their neighbours, refused or allowed
        (reaches_into_the_engine, f"{SERVER}.web.app", f"{ENGINE}.errors", True),
        (reaches_into_the_engine, f"{SERVER}.sessions.session", ENGINE, False),
        (reaches_into_the_engine, f"{SERVER}.runtime.engines", f"{ENGINE}.local.batched", False),
        (reaches_into_the_engine, f"{ENGINE}.local.batched", f"{ENGINE}.errors", False),
        (crosses_engines, f"{ENGINE}.local.hf", f"{ENGINE}.openai.errors", True),
        (crosses_engines, f"{ENGINE}.openai.client", f"{ENGINE}.errors", False),
        (crosses_engines, f"{ENGINE}.local.hf", f"{ENGINE}.local.loader", False),
    ],
)
def test_the_interface_checks_refuse_what_they_name(
    rule: Callable[[str, str], bool], module: str, target: str, refused: bool
) -> None:
    assert rule(module, target) is refused


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from wschat.protocol import ErrorCode, ProtocolError\n", ["ErrorCode", "ProtocolError"]),
        ("from wschat.protocol import FinishReason, Usage\n", []),
        ("from wschat.protocol.errors import Overloaded\n", ["errors.Overloaded"]),
        ("from wschat.protocol import errors\n", ["errors"]),
        ("import wschat.protocol.errors as e\n", ["errors"]),
        ("from wschat import protocol\nprotocol.TooLarge('x')\n", ["TooLarge"]),
        ("import wschat.protocol as p\np.Error\n", ["Error"]),
        (
            "import wschat.protocol\nwschat.protocol.constants.ErrorCode\n",
            ["constants.ErrorCode"],
        ),
        ("def later() -> None:\n    from wschat.protocol import Internal\n", ["Internal"]),
        ("from .base import TooLarge\n", []),  # the engine's own name: not the wire's
    ],
)
def test_the_wire_error_check_sees_every_way_of_importing_one(
    tmp_path: Path, source: str, found: list[str]
) -> None:
    path = tmp_path / "errors.py"
    path.write_text(source)
    known = {PROTOCOL, PROTOCOL_ERRORS, f"{PROTOCOL}.constants", f"{ENGINE}.base"}
    names = list(wire_errors_in(f"{ENGINE}.errors", path, known, wire_error_names()))
    assert [name.removeprefix(f"{PROTOCOL}.") for name in names] == found

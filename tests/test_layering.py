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
- ``web/`` (the doors) and ``runtime/`` import the session layer only as
  ``wschat.server.sessions``, its face: a session's inputs, the hub, what a door needs to serve
  one, never a module of the layer;
- ``engine.local`` (torch in this process) and ``engine.openai`` (a server over HTTP) never
  import each other: each is an engine of its own over the interface;
- the engine imports no wire errors. A wire error is whatever names a wire error code: the
  module ``wschat.protocol.errors`` (imported itself or any name from it, e.g. ``TooLarge``,
  ``ProtocolError``, ``SessionMisuse``), every name it defines however it is imported (``from
  wschat.protocol import Overloaded``, ``protocol.Overloaded`` on an imported protocol module),
  ``ErrorCode`` and the ``Error`` frame. An engine's failure is a class of
  ``engine/errors.py``; ``sessions/error_boundary.py`` gives it its code.

Modules, in the packages, the tests and the bench:

- no module reads another module's private names (``tests/private_names.py`` says how it is
  seen, and the one exception: a unit test reading the state of the module it tests);
- no two modules import each other at run time (an import under ``if TYPE_CHECKING:`` never
  runs).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .import_graph import (
    Edge,
    import_graph,
    imports_of,
    our_modules,
    package_dirs,
    source_modules,
    within,
)
from .outside_writes import outside_writes
from .private_names import Index, allowed, private_reaches
from .wire_errors import PROTOCOL, PROTOCOL_ERRORS, wire_error_names, wire_errors_in

SERVER = "wschat.server"
ENGINE = "wschat.server.engine"
SESSIONS = "wschat.server.sessions"
WEB = "wschat.server.web"
LOCAL_ENGINES = "wschat.server.engine.local"
OPENAI_ENGINE = "wschat.server.engine.openai"
HEAVY = ("torch", "transformers")
CLIENT = "wschat.client"
# bottom to top: a layer may import its own modules and those of the layers before it
LAYERS = tuple(f"{SERVER}.{name}" for name in ("engine", "sessions", "web", "runtime"))
SETTINGS = f"{SERVER}.settings"
RUNTIME = f"{SERVER}.runtime"
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


def reaches_into_the_sessions(module: str, target: str) -> bool:
    """Whether a module of ``web`` or ``runtime`` imports a module of the session layer other
    than its package (its face)."""
    above = within(module, WEB) or within(module, RUNTIME)
    return above and within(target, SESSIONS) and target != SESSIONS


def crosses_engines(module: str, target: str) -> bool:
    """Whether one of ``engine.local`` and ``engine.openai`` imports the other."""
    pair = (LOCAL_ENGINES, OPENAI_ENGINE)
    return any(within(module, a) and within(target, b) for a, b in (pair, pair[::-1]))


def test_outside_the_engine_and_runtime_only_the_engine_package_is_imported() -> None:
    bad = sorted(edge for edge in import_graph() if reaches_into_the_engine(*edge))
    assert bad == []


def test_the_doors_and_the_runtime_import_the_sessions_only_through_their_face() -> None:
    bad = sorted(edge for edge in import_graph() if reaches_into_the_sessions(*edge))
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
        # the doors reached into ten modules of the session layer
        (reaches_into_the_sessions, f"{WEB}.openai_api.routes", f"{SESSIONS}.session", True),
        (reaches_into_the_sessions, f"{WEB}.app", f"{SESSIONS}.hub", True),
        (reaches_into_the_sessions, f"{SERVER}.runtime.shutdown", f"{SESSIONS}.core", True),
        (reaches_into_the_sessions, f"{WEB}.connection", SESSIONS, False),
        (reaches_into_the_sessions, f"{SESSIONS}.hub", f"{SESSIONS}.store", False),
        (reaches_into_the_sessions, "tests.sessions.test_core", f"{SESSIONS}.core", False),
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


# -- modules --------------------------------------------------------------------------------


def test_no_module_reads_another_modules_private_names() -> None:
    modules = source_modules()
    bad = [
        f"{r.module}:{r.line} {r.read} ({' '.join(r.owners)})"
        for r in private_reaches(Index(modules), modules)
        if not allowed(r)
    ]
    assert bad == []


# the real modules the planted sources below name
PLANTED_NAME = (
    "wschat.client",
    "wschat.client.reply",
    "wschat.server.engine.formats",
    "wschat.server.engine.local.kvstore",
    "bench.stats",
)
CLIENT_ROUTER = "wschat.client.router"
IMPORT_REPLY = "from wschat.client.reply import Reply\n"


@pytest.mark.parametrize(
    ("module", "source", "refused"),
    [
        # the violations the check was written against
        (
            "wschat.server.engine.history",
            "from .formats import UserTurn, _without_end\n",
            ["_without_end"],
        ),
        (
            CLIENT_ROUTER,
            IMPORT_REPLY + "def feed(reply: Reply) -> None:\n    reply._finish()\n",
            ["reply._finish"],
        ),
        ("bench.llamacpp", "from .stats import _figures\n", ["_figures"]),
        # every other way of reaching one
        (CLIENT_ROUTER, "def later() -> None:\n    from bench.stats import _fmt\n", ["_fmt"]),
        (
            CLIENT_ROUTER,
            "from wschat.server.engine import formats\nformats._heads\n",
            ["formats._heads"],
        ),
        (CLIENT_ROUTER, "import wschat.server.engine.formats as f\nf._heads\n", ["f._heads"]),
        (CLIENT_ROUTER, "import bench.stats\nbench.stats._figures([])\n", ["bench.stats._figures"]),
        (CLIENT_ROUTER, IMPORT_REPLY + "Reply._finish\n", ["Reply._finish"]),
        (
            CLIENT_ROUTER,
            "from wschat.client import Reply\ndef f(r: Reply | None) -> None:\n    r._x\n",
            ["r._x"],
        ),
        (CLIENT_ROUTER, IMPORT_REPLY + "def f(r: 'Reply') -> None:\n    r._x\n", ["r._x"]),
        (CLIENT_ROUTER, IMPORT_REPLY + "r = Reply('a', send_cancel=print)\nr._x\n", ["r._x"]),
        (
            CLIENT_ROUTER,
            IMPORT_REPLY + "class Router:\n    def __init__(self) -> None:\n"
            "        self.reply = Reply('a', send_cancel=print)\n"
            "    def end(self) -> None:\n        self.reply._x()\n",
            ["self.reply._x"],
        ),
        # the object's class unknown: a name only another module's classes define
        (
            CLIENT_ROUTER,
            "def end(reply: object) -> None:\n    reply._finish()\n",
            ["reply._finish"],
        ),
        # a class's own, a third party's, a dunder: allowed
        (
            CLIENT_ROUTER,
            "class Reply:\n    def _finish(self) -> None:\n        super()._finish()\n"
            "    def same(self, other: Reply) -> None:\n        other._finish()\n"
            "    def again(self, other: object) -> None:\n        other._finish()\n",
            [],
        ),
        (CLIENT_ROUTER, "import torch\ntorch.ops.mkldnn._linear_pointwise\n", []),
        (
            CLIENT_ROUTER,
            "from urllib.parse import urlsplit\nurlsplit('x')._replace(path='/')\n",
            [],
        ),
        (
            CLIENT_ROUTER,
            IMPORT_REPLY + "Reply.__name__\nfrom wschat.client.reply import __doc__\n",
            [],
        ),
        # a unit test reads the state of the module it tests, nothing more
        ("tests.engine.test_kvstore", "def f(store: object) -> None:\n    store._entries\n", []),
        ("tests.engine.test_kvstore_budget", "def f(s: object) -> None:\n    s._entries\n", []),
        (
            "tests.engine.test_kv_reuse",
            "def f(store: object) -> None:\n    store._entries\n",
            ["store._entries"],
        ),
        (
            "tests.client.test_kvstore",
            "def f(store: object) -> None:\n    store._entries\n",
            ["store._entries"],
        ),
        (
            "tests.engine.test_kvstore",
            "from wschat.server.engine.local.kvstore import _x\n",
            ["_x"],
        ),
    ],
)
def test_the_private_name_check_refuses_what_it_names(
    tmp_path: Path, module: str, source: str, refused: list[str]
) -> None:
    modules = source_modules()
    index = Index({name: modules[name] for name in PLANTED_NAME})
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    index.add(module, planted)
    assert [r.read for r in private_reaches(index, [module]) if not allowed(r)] == refused


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


# -- a session's attributes ----------------------------------------------------------------------


def test_no_module_sets_a_sessions_attributes_from_outside_its_own() -> None:
    modules = source_modules()
    writes = outside_writes(Index(modules), modules)
    assert [f"{w.module}:{w.line} {w.written}" for w in writes] == []


# the real modules the planted sources below name
PLANTED_WRITE = (
    "wschat.server.sessions.core",
    "wschat.server.sessions.session",
    "wschat.server.sessions.relay",
    "wschat.server.sessions.store",
    "wschat.server.sessions.hub",
    "wschat.server.engine.history",
)
IMPORT_SESSION = "from wschat.server.sessions.session import Session\n"


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        # the writes the rule was written against: hooks and collaborators set from outside
        (
            IMPORT_SESSION + "def hook(session: Session) -> None:\n    session.held = None\n",
            ["session.held"],
        ),
        (
            IMPORT_SESSION + "def f(session: Session) -> None:\n    session.core.scope = 'o'\n",
            ["session.core.scope"],
        ),
        # its chat's, reached through the session or held as one
        (
            IMPORT_SESSION + "def f(session: Session) -> None:\n    session.chat.scope = 'o'\n",
            ["session.chat.scope"],
        ),
        (
            IMPORT_SESSION + "def f(session: Session) -> None:\n    session.core.chat.key = 'k'\n",
            ["session.core.chat.key"],
        ),
        (
            IMPORT_SESSION + "class Reply:\n    def __init__(self, session: Session) -> None:\n"
            "        self.session = session\n"
            "    def begin(self) -> None:\n        self.session.chat.key = 'k'\n",
            ["self.session.chat.key"],
        ),
        (
            "from wschat.server.engine.history import Chat\n"
            "def f(chat: Chat) -> None:\n    chat.key = 'k'\n    chat.conversation = None\n",
            ["chat.key", "chat.conversation"],
        ),
        (
            IMPORT_SESSION + "def f(s: Session) -> None:\n    s.core.turn_ids += ['x']\n",
            ["s.core.turn_ids"],
        ),
        (
            IMPORT_SESSION + "def f(s: Session) -> None:\n    del s.core.accepted\n",
            ["s.core.accepted"],
        ),
        (
            IMPORT_SESSION + "def f(s: Session, mp: object) -> None:\n"
            "    mp.setattr(s, 'relay', None)\n    setattr(s.core, 'staged', [])\n",
            ["mp.setattr(s, 'relay', None)", "setattr(s.core, 'staged', [])"],
        ),
        (
            "from wschat.server.sessions.hub import Hub\n"
            "def f(hub: Hub) -> None:\n    session = hub.new_session()\n    session.held = None\n",
            ["session.held"],
        ),
        # the object's class unknown: a name only the session's classes define
        ("def f(session: object) -> None:\n    session.used_ids = set()\n", ["session.used_ids"]),
        # reads, calls, another class's attribute of a shared name, its own: allowed
        (
            IMPORT_SESSION + "def f(s: Session) -> None:\n    s.core.turn_ids\n"
            "    s.relay.connected(None)\n    s.relay.drop_last = None\n",
            [],
        ),
        ("def f(store: object) -> None:\n    store.clock = None\n", []),
        ("class Session:\n    def __init__(self) -> None:\n        self.held = None\n", []),
    ],
)
def test_the_outside_write_check_refuses_what_it_names(
    tmp_path: Path, source: str, refused: list[str]
) -> None:
    modules = source_modules()
    index = Index({name: modules[name] for name in PLANTED_WRITE})
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    index.add("tests.sessions.test_planted", planted)
    written = [w.written for w in outside_writes(index, ["tests.sessions.test_planted"])]
    assert written == refused

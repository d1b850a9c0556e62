"""No module, in the packages, the tests and the bench, reads another module's private names
(``tests/private_names.py`` says how a reach is seen, and the one exception: a unit test reading
the state of the module it tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .import_graph import (
    source_modules,
)
from .private_names import Index, allowed, private_reaches


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

"""No module sets an attribute of a ``Session``, its ``SessionCore`` or its ``Chat`` from outside
the module that defines it (``tests/outside_writes.py`` says how a write is seen): their
collaborators are passed in when they are made."""

from __future__ import annotations

from pathlib import Path

import pytest

from .import_graph import (
    source_modules,
)
from .outside_writes import outside_writes
from .private_names import Index


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

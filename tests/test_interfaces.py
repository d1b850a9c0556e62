"""Interfaces, not only layers (``test_layering.py``), read from the same import graph:

- outside ``engine/`` and ``runtime/`` (which builds the engines), the engine is imported only as
  ``wschat.server.engine``, the package's ``__init__``: sessions and web see the ``Engine``
  interface and the engine's errors, never a module that implements them;
- ``web/`` (the doors) and ``runtime/`` import the session layer only as
  ``wschat.server.sessions``, its face: a session's inputs, the hub, what a door needs to serve
  one, never a module of the layer; the Responses API runs its responses through the chat API's
  door (``Reply``), with no rule of its own;
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

from collections.abc import Callable
from pathlib import Path

import pytest

from .import_graph import (
    import_graph,
    our_modules,
    within,
)
from .layers import ENGINE, LOCAL_ENGINES, OPENAI_ENGINE, RUNTIME, SERVER, SESSIONS, WEB
from .wire_errors import PROTOCOL, PROTOCOL_ERRORS, wire_error_names, wire_errors_in


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


def test_the_responses_api_is_a_door_onto_the_chat_apis_session_core() -> None:
    """The Responses API (web/responses) runs each response as the chat API runs a completion,
    a ``Reply`` (web/openai_api/reply.py) whose session ``Hub.new_request`` makes: it holds no
    rule of its own, reaching neither a module of the session layer nor of the engine."""
    edges = {(m, t) for m, t in import_graph() if within(m, f"{WEB}.responses")}
    assert (f"{WEB}.responses.run", f"{WEB}.openai_api.reply") in edges
    assert (f"{WEB}.openai_api.reply", SESSIONS) in set(import_graph())
    reaching = [e for e in edges if reaches_into_the_sessions(*e) or reaches_into_the_engine(*e)]
    assert reaching == []


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
        (reaches_into_the_sessions, f"{WEB}.responses.run", f"{SESSIONS}.limits", True),
        (reaches_into_the_sessions, f"{WEB}.responses.run", SESSIONS, False),
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

"""Fixtures of the tests that run the ``wschat`` command (``test_cli.py``, ``test_waiting.py``,
``test_repl.py``: each names them in its ``pytestmark``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def own_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's CLI remembers the servers that answered (client/waiting.py) in a folder of
    its own: one test's server never counts as having answered for another's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

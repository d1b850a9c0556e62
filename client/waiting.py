"""What the ``wschat`` command says while it waits for a server to serve (``--wait``).

One line as a wait begins and whenever what it waits for changes (nothing listening, then the
model loading), then ``still waiting for URL: ... (45 s of 600)`` every ``every`` seconds
(``WSCHAT_WAIT_NOTICE_S``, default 15), so a wait of minutes never looks like a hang.

A wrong port looks like a server not started yet: nothing listens either way. So the command
remembers the addresses where a server has answered (``answered_file``: one ``host:port`` a
line, the latest ``REMEMBERED`` of them), and where none ever has, the first line says so and
names ``--wait``, for a user who mistyped the port rather than started the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from .errors import ModelLoadingError, NotServingYetError

DEFAULT_EVERY_S = 15.0
REMEMBERED = 100  # addresses kept; the oldest go first

WAITING_NOTICE = "waiting for the model to load (up to {seconds:g} s)..."
NOT_LISTENING_NOTICE = "{error}; waiting for the server (up to {seconds:g} s)..."
NEVER_ANSWERED_NOTICE = (
    "{error}, and no server has answered at {address} before (is the port right?); waiting up "
    "to {seconds:g} s for one to start there (--wait SECONDS to shorten, --wait 0 not to wait)..."
)
STILL_WAITING_NOTICE = "still waiting for {url}: {why} ({waited:g} s of {seconds:g})"


def answered_file() -> Path:
    """Where the addresses that answered are kept: ``$XDG_STATE_HOME/wschat/answered``."""
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "wschat" / "answered"


def server_address(url: str) -> str:
    """``host:port`` of a WebSocket URL (the port its scheme implies when it names none)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return f"{(parts.hostname or '').lower()}:{port}"


def _remembered() -> list[str]:
    try:
        return answered_file().read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return []


def has_answered(url: str) -> bool:
    return server_address(url) in _remembered()


def remember_answered(url: str) -> None:
    """Note that a server answered at ``url``'s address; a state folder that cannot be written
    only loses the note."""
    address = server_address(url)
    others = [a for a in _remembered() if a != address]
    kept = [*others[-(REMEMBERED - 1) :], address]
    path = answered_file()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(kept) + "\n", encoding="utf-8")


def _what(error: NotServingYetError) -> str:
    """What a wait is waiting on, in a few words."""
    if isinstance(error, ModelLoadingError):
        return "the model is loading"
    if error.status is not None:  # a proxy in front, with no server up behind it
        return f"HTTP {error.status}"
    return "nothing listening"


class WaitingNotices:
    """``connect``'s ``on_waiting`` (``notice``) and the lines that follow while it waits;
    ``stop`` ends them, with ``answered=True`` once a session opened."""

    def __init__(
        self, url: str, seconds: float, err: TextIO, every: float = DEFAULT_EVERY_S
    ) -> None:
        self.url = url
        self.seconds = seconds
        self.every = every
        self._err = err
        self._waiting_on: NotServingYetError | None = None  # the latest try's error
        self._ticker: asyncio.Task[None] | None = None

    def notice(self, error: NotServingYetError) -> None:
        answered = isinstance(error, ModelLoadingError) or error.status is not None
        if answered:
            remember_answered(self.url)
        first = self._waiting_on is None
        self._waiting_on = error
        if isinstance(error, ModelLoadingError):
            line = WAITING_NOTICE
        elif first and not answered and not has_answered(self.url):
            line = NEVER_ANSWERED_NOTICE
        else:
            line = NOT_LISTENING_NOTICE
        address = server_address(self.url)
        self._say(line.format(error=error.message, seconds=self.seconds, address=address))
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name="wschat-waiting-notices")

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        ticks = 0
        while True:
            ticks += 1
            await asyncio.sleep(max(0.0, began + ticks * self.every - loop.time()))
            assert self._waiting_on is not None
            why = _what(self._waiting_on)
            waited = ticks * self.every
            self._say(
                STILL_WAITING_NOTICE.format(
                    url=self.url, why=why, waited=waited, seconds=self.seconds
                )
            )

    def stop(self, *, answered: bool = False) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if answered:
            remember_answered(self.url)

    def _say(self, line: str) -> None:
        print(line, file=self._err, flush=True)

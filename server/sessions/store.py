"""Where sessions are kept between connections: the ``SessionStore`` interface, and
``MemorySessionStore``, which keeps detached sessions in this process for ``?resume=`` within
the resume window. ``redis_store.py`` keeps them in Redis, where every replica can claim them;
``hub.open_store`` opens the one ``--session-store`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .session import Session
from .states import SessionState

# how long a claim waits for the connection that holds its session to end (a client may see its
# connection drop, and reconnect, before the server does)
HANDOVER_S = 2.0

# A session rebuilt under its key from its exported state and the checkpoint of a reply that
# was running (``snapshot.import_state``).
Rebuild = Callable[[str, dict[str, Any], dict[str, Any] | None], Session]


@dataclass(frozen=True, slots=True)
class Claim:
    """What a resume token gave: the session, or None (a new session starts); ``unavailable``
    says why a resume could not even be tried (the store is down)."""

    session: Session | None
    unavailable: str | None = None


class SessionStore(Protocol):
    live: dict[str, Session]  # connected here, by key
    # other processes (replicas) can resume what it keeps: a replica that shuts down leaves its
    # sessions there (runtime/shutdown.py) rather than closing them
    shared: bool

    @property
    def detached_count(self) -> int: ...

    @property
    def errors(self) -> int:
        """Operations on the store that failed (each retry counts)."""
        ...

    async def add(self, session: Session) -> str:
        """``session`` is connected here and owned by this connection; its new resume token."""
        ...

    async def claim(self, token: str) -> Claim:
        """The detached session of ``token``, once (a token is single-use), and only while no
        connection owns it. A session whose connection is ending (a drop the server has not
        seen through yet), or whose owner died, is waited for, a bounded time."""
        ...

    def detached(self) -> list[Session]:
        """The detached sessions this process keeps (a reply may go on in one of them)."""
        ...

    def checkpoint(self, session: Session) -> None:
        """A turn boundary: the session's state is to be kept (without waiting for it)."""
        ...

    def progress(self, session: Session) -> None:
        """The running reply grew: its checkpoint is to be kept (at most once a second)."""
        ...

    async def detach(self, session: Session) -> bool:
        """The connection is over: keep the conversation for resumption (the generation was
        already stopped); False when it is not kept: no resume window, or the session was
        closed (shutdown)."""
        ...

    def expire(self) -> list[Session]:
        """Detached sessions this process no longer keeps; the caller forgets their engine
        state."""
        ...

    async def aclose(self) -> None: ...


@dataclass(eq=False)
class _Detached:
    session: Session
    expires_at: float


class MemorySessionStore:
    """Sessions by key; a resume token maps to the key of a detached session.

    Detached sessions are bounded in time (the resume window) and in number (``max_detached``,
    oldest dropped first), so connection churn cannot pile them up. A claim of a session still
    connected waits up to ``handover_s`` for its connection to end: a client that saw its
    connection drop may reconnect before the server has finished with the old one.
    """

    errors = 0
    shared = False

    def __init__(
        self,
        resume_window_s: float,
        max_detached: int = 1000,
        handover_s: float = HANDOVER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resume_window_s = resume_window_s
        self.max_detached = max_detached
        self.handover_s = handover_s
        self.clock = clock  # the windows' time base, seconds; tests pass one they move
        self.live: dict[str, Session] = {}
        self._detached: dict[str, _Detached] = {}  # by resume token
        self._tokens: dict[str, str] = {}  # session key -> resume token
        self._connected: dict[str, str] = {}  # resume token -> key, while connected
        # set and replaced at each detach: wakes the claims waiting for a connection to end
        self._let_go = asyncio.Event()

    async def add(self, session: Session) -> str:
        self.live[session.key] = session
        token = secrets.token_urlsafe(24)
        self._tokens[session.key] = token
        self._connected[token] = session.key
        return token

    async def detach(self, session: Session) -> bool:
        self.live.pop(session.key, None)
        token = self._tokens.pop(session.key, None)
        self._connected.pop(token or "", None)
        self._let_go.set()
        self._let_go = asyncio.Event()
        if token is None or self.resume_window_s <= 0 or session.state is SessionState.CLOSED:
            return False
        self._detached[token] = _Detached(session, self.clock() + self.resume_window_s)
        return True

    async def claim(self, token: str) -> Claim:
        """While its window is open (``expire`` drops the rest)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.handover_s):
                while token in self._connected:
                    await self._let_go.wait()
        entry = self._detached.get(token)
        if entry is None or entry.expires_at <= self.clock():
            return Claim(None)
        del self._detached[token]
        return Claim(entry.session)

    def checkpoint(self, session: Session) -> None:
        return None  # the session itself is what is kept

    def progress(self, session: Session) -> None:
        return None

    def expire(self) -> list[Session]:
        now = self.clock()
        gone = [t for t, d in self._detached.items() if d.expires_at <= now]
        over = len(self._detached) - len(gone) - self.max_detached
        if over > 0:  # insertion order is detach order: the oldest go first
            gone += [t for t in self._detached if t not in gone][:over]
        return [self._detached.pop(t).session for t in gone]

    def detached(self) -> list[Session]:
        return [d.session for d in self._detached.values()]

    @property
    def detached_count(self) -> int:
        return len(self._detached)

    async def aclose(self) -> None:
        return None

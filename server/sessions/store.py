"""``SessionStore``: live sessions by key, and detached ones kept for ``?resume=`` within the
resume window."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from .session import Session, SessionState


@dataclass(eq=False)
class _Detached:
    session: Session
    expires_at: float


class SessionStore:
    """Sessions by key; a resume token maps to the key of a detached session.

    Detached sessions are bounded in time (the resume window) and in number (``max_detached``,
    oldest dropped first), so connection churn cannot pile them up.
    """

    def __init__(
        self,
        resume_window_s: float,
        max_detached: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resume_window_s = resume_window_s
        self.max_detached = max_detached
        self.clock = clock  # the windows' time base, seconds; tests pass one they move
        self.live: dict[str, Session] = {}
        self._detached: dict[str, _Detached] = {}  # by resume token
        self._tokens: dict[str, str] = {}  # session key -> resume token

    def add(self, session: Session) -> str:
        self.live[session.key] = session
        token = secrets.token_urlsafe(24)
        self._tokens[session.key] = token
        return token

    def detach(self, session: Session) -> bool:
        """Keep the conversation for resumption (the generation was already stopped); False
        when it is not kept: no resume window, or the session was closed (shutdown)."""
        self.live.pop(session.key, None)
        token = self._tokens.pop(session.key, None)
        if token is None or self.resume_window_s <= 0 or session.state is SessionState.CLOSED:
            return False
        self._detached[token] = _Detached(session, self.clock() + self.resume_window_s)
        return True

    def claim(self, token: str) -> Session | None:
        """The detached session of ``token`` while its window is open (``expire`` drops the
        rest: the caller forgets their engine state)."""
        entry = self._detached.get(token)
        if entry is None or entry.expires_at <= self.clock():
            return None
        del self._detached[token]
        return entry.session

    def expire(self) -> list[Session]:
        """Drop detached sessions past their window or over the cap; returns them."""
        now = self.clock()
        gone = [t for t, d in self._detached.items() if d.expires_at <= now]
        over = len(self._detached) - len(gone) - self.max_detached
        if over > 0:  # insertion order is detach order: the oldest go first
            gone += [t for t in self._detached if t not in gone][:over]
        return [self._detached.pop(t).session for t in gone]

    @property
    def detached_count(self) -> int:
        return len(self._detached)

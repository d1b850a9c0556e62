"""A session's states and what moves it from one to another (``TRANSITIONS``); its rules, which
handler each input gets in each state, are its core's (core.py).

    IDLE --prompt (regenerate, tool results) accepted--> QUEUED --slot granted--> RUNNING
    RUNNING --run ended--> IDLE
    QUEUED --run ended (cancelled while queued)--> IDLE
    RUNNING --dropped--> RUNNING_DETACHED --resumed--> RUNNING
    RUNNING_DETACHED --run ended (or the grace ran out: cancelled)--> IDLE
    any --close--> CLOSED   (no resume window, detach expiry, shutdown)

(a drop mid-reply: inputs.py ``Dropped``). A change ``TRANSITIONS`` does not list is our bug
(``SessionMisuse``).
"""

from __future__ import annotations

from enum import Enum


class SessionState(Enum):
    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    RUNNING_DETACHED = "running, detached"
    CLOSED = "closed"


class Change(Enum):
    """What moves a session from one state to another."""

    ACCEPTED = "prompt or regenerate accepted"
    STARTED = "slot granted"
    ENDED = "run ended"
    DROPPED = "dropped mid-reply"
    RESUMED = "resumed"
    CLOSE = "close"


IDLE, QUEUED, RUNNING, RUNNING_DETACHED, CLOSED = SessionState

# (state, change) -> next state; a pair not listed is our bug, never the peer's.
TRANSITIONS: dict[SessionState, dict[Change, SessionState]] = {
    IDLE: {Change.ACCEPTED: QUEUED, Change.CLOSE: CLOSED},
    QUEUED: {Change.STARTED: RUNNING, Change.ENDED: IDLE, Change.CLOSE: CLOSED},
    RUNNING: {Change.ENDED: IDLE, Change.DROPPED: RUNNING_DETACHED, Change.CLOSE: CLOSED},
    RUNNING_DETACHED: {Change.ENDED: IDLE, Change.RESUMED: RUNNING, Change.CLOSE: CLOSED},
    CLOSED: {Change.CLOSE: CLOSED},
}
BUSY_STATES = frozenset({QUEUED, RUNNING, RUNNING_DETACHED})
DETACHED_STATES = frozenset({RUNNING_DETACHED})

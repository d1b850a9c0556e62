"""``SessionStore``: detached sessions are kept for resumption, bounded in time and number."""

from __future__ import annotations

from typing import cast

from wschat.server.hub import SessionStore
from wschat.server.session import Session


class FakeSession:
    def __init__(self, key: str) -> None:
        self.key = key


def detached(store: SessionStore, key: str) -> str:
    session = cast(Session, FakeSession(key))
    token = store.add(session)
    store.detach(session)
    return token


def test_churn_keeps_at_most_max_detached_sessions_dropping_the_oldest() -> None:
    store = SessionStore(resume_window_s=120, max_detached=3)
    tokens = [detached(store, f"s{i}") for i in range(5)]
    dropped = store.expire()
    assert [s.key for s in dropped] == ["s0", "s1"]
    assert store.detached_count == 3
    assert store.claim(tokens[0]) is None
    claimed = store.claim(tokens[4])
    assert claimed is not None and claimed.key == "s4"


def test_a_session_past_its_window_cannot_be_claimed_and_expires() -> None:
    now = [1000.0]
    store = SessionStore(resume_window_s=10.0, clock=lambda: now[0])
    token = detached(store, "s")
    now[0] += 9.5
    assert store.expire() == []
    now[0] += 0.5
    assert store.claim(token) is None
    assert [s.key for s in store.expire()] == ["s"]
    assert store.detached_count == 0


def test_without_a_window_nothing_is_kept() -> None:
    store = SessionStore(resume_window_s=0.0)
    assert store.claim(detached(store, "s")) is None
    assert store.detached_count == 0

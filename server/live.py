"""What ``/v1/stats`` sends: a ``Stats`` frame built from the hub, with a table of live sessions.

Session keys never leave the server as they are: the table names a session by a short hash of
its key (the same key the chat client sees as ``ready.session``, so an operator can match a row
to a user's report, but a row cannot be turned into a key).
"""

from __future__ import annotations

import hashlib
from typing import Any

from wschat.protocol import Stats

from .hub import Hub
from .session import Session

MAX_TABLE_ROWS = 200
_STATE_ORDER = {"running": 0, "queued": 1, "idle": 2, "closed": 3}


def anonymous_id(session_key: str) -> str:
    return hashlib.sha256(session_key.encode()).hexdigest()[:10]


def session_row(session: Session) -> dict[str, Any]:
    """One row of the dashboard's table: tokens generated in the conversation so far."""
    turns = session.conversation.turns
    generated = sum(len(t.ids) for t in turns if t.role == "model")
    run = session.run
    if run is not None:
        generated += run.completion_tokens
    return {
        "id": anonymous_id(session.key),
        "state": session.state.value,
        "tokens": generated,
        "turns": sum(1 for t in turns if t.role == "user"),
    }


def snapshot(hub: Hub) -> Stats:
    stats = hub.stats
    p50, p95 = stats.ttft_percentiles()
    rows = sorted(
        (session_row(s) for s in list(hub.sessions.live.values())),
        key=lambda r: (_STATE_ORDER.get(r["state"], 9), -r["tokens"]),
    )
    info = hub.engine.info if hub.engine is not None else None
    return Stats(
        sessions=len(hub.sessions.live),
        running=hub.slots.running,
        queued=hub.slots.queued,
        tokens_per_s=stats.tokens_per_s(),
        ttft_p50_ms=p50,
        ttft_p95_ms=p95,
        cancellations=stats.cancellations,
        errors=dict(stats.errors),
        kv_tokens=_kv_figure(hub, "tokens"),
        model=info.model if info else "",
        device=info.device if info else "",
        uptime_s=stats.uptime_s,
        live=tuple(rows[:MAX_TABLE_ROWS]),
        kv_bytes=_kv_figure(hub, "bytes"),
        kv_budget_bytes=_kv_figure(hub, "budget_bytes"),
    )


def _kv_figure(hub: Hub, name: str) -> int | None:
    """``tokens``, ``bytes`` or ``budget_bytes`` of the KV state the engine holds across idle
    sessions, when it keeps such a store (one for all its paths: engine/kvstore.py)."""
    store = getattr(hub.engine, "kv", None)
    value = getattr(store, name, None)
    return value if isinstance(value, int) else None

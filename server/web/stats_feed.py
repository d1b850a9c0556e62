"""What ``/v1/stats`` sends: a ``Stats`` frame built from the hub, with a table of live sessions,
and ``StatsFeed``, which serves it to every subscriber and keeps the last minutes of what the
dashboard charts (one sample a second, whether anyone watches), sent with a socket's first frame
so that a dashboard opened now does not start blank.

Session keys never leave the server as they are: the table names a session by a short hash of
its key (the same key the chat client sees as ``ready.session``, so an operator can match a row
to a user's report, but a row cannot be turned into a key).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect
from wschat.protocol import HISTORY_SERIES, CloseCode, Stats, encode

from ..sessions import OPENAI_API, WEBSOCKET, Session

if TYPE_CHECKING:
    from ..sessions import Hub

MAX_TABLE_ROWS = 200
# samples kept for a new dashboard's charts, one each interval: the 3 minutes a chart spans
HISTORY_SAMPLES = 180
_STATE_ORDER = {"running": 0, "queued": 1, "idle": 2, "closed": 3}


def anonymous_id(session_key: str) -> str:
    return hashlib.sha256(session_key.encode()).hexdigest()[:10]


def session_row(session: Session, api: str = WEBSOCKET) -> dict[str, Any]:
    """One row of the dashboard's table: tokens generated in the conversation so far, and of
    them the reply in flight's (nil when none is); the API the session came by."""
    chat = session.chat
    run = session.run
    reply = run.completion_tokens if run is not None else None
    return {
        "id": anonymous_id(session.key),
        "state": session.state.value,
        "tokens": chat.generated_tokens + (reply or 0),
        "turns": chat.turns,
        "reply": reply,
        "api": api,
    }


def snapshot(hub: Hub) -> Stats:
    stats = hub.stats
    p50, p95 = stats.ttft_percentiles()
    rows = sorted(
        [
            *(session_row(s) for s in list(hub.sessions.live.values())),
            *(session_row(s, OPENAI_API) for s in list(hub.requests)),
        ],
        key=lambda r: (_STATE_ORDER.get(r["state"], 9), -r["tokens"]),
    )
    info = hub.engine.info if hub.engine is not None else None
    # what the engine keeps across idle sessions, every path of it (engine/local/kvstore.py)
    kv = hub.engine.kv_usage() if hub.engine is not None else None
    return Stats(
        sessions=len(hub.sessions.live),
        running=hub.slots.running,
        queued=hub.slots.queued,
        tokens_per_s=stats.tokens_per_s(),
        ttft_p50_ms=p50,
        ttft_p95_ms=p95,
        cancellations=stats.cancellations,
        errors=dict(stats.errors),
        kv_tokens=kv.tokens if kv else None,
        model=info.model if info else "",
        device=info.runs_on if info else "",
        uptime_s=stats.uptime_s,
        live=tuple(rows[:MAX_TABLE_ROWS]),
        kv_bytes=kv.bytes if kv else None,
        kv_budget_bytes=kv.budget_bytes if kv else None,
        rewinds=stats.rewinds,
        regenerates=stats.regenerates,
    )


def sample(hub: Hub) -> tuple[float | None, ...]:
    """What the dashboard charts now, in ``HISTORY_SERIES``' order."""
    p50, p95 = hub.stats.ttft_percentiles()
    return (
        hub.stats.tokens_per_s(),
        hub.slots.running,
        hub.slots.queued,
        len(hub.sessions.live),
        p50,
        p95,
    )


class StatsFeed:
    """Every ``/v1/stats`` socket gets a ``stats`` frame at once, with the history, and then one
    each ``interval_s``; the snapshot is built and encoded once per interval whatever the number
    of subscribers, and the sockets are known so that a shutdown closes them with 1001."""

    def __init__(
        self, hub: Hub, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.hub = hub
        self.interval_s = interval_s
        self._clock = clock
        self._snapshot: Stats | None = None
        self._frame: bytes | None = None
        self._built_at = 0.0
        self.sockets: set[WebSocket] = set()
        # one sample an interval (``sample_forever``), oldest first; bounded
        self.samples: deque[tuple[float | None, ...]] = deque(maxlen=HISTORY_SAMPLES)

    def frame(self) -> bytes:
        """The latest snapshot, encoded; rebuilt once it is ``interval_s`` old."""
        now = self._clock()
        if self._frame is None or now - self._built_at >= self.interval_s:
            self._snapshot = snapshot(self.hub)
            self._frame, self._built_at = encode(self._snapshot), now
        return self._frame

    def first_frame(self) -> bytes:
        """The latest snapshot with the samples kept: what a new socket gets first."""
        self.frame()
        assert self._snapshot is not None
        columns = [tuple(s[i] for s in self.samples) for i in range(len(HISTORY_SERIES))]
        history = dict(zip(HISTORY_SERIES, columns, strict=True))
        return encode(dataclasses.replace(self._snapshot, history=history))

    async def sample_forever(self) -> None:
        """Keep a sample each ``interval_s`` until cancelled (the app's lifespan runs it)."""
        while True:
            self.samples.append(sample(self.hub))
            await asyncio.sleep(self.interval_s)

    async def serve(self, websocket: WebSocket) -> None:
        """Stream to an accepted socket until the peer leaves or ``close_all``."""
        gone = asyncio.Event()  # set by the reader when the peer disconnects

        async def read_until_gone() -> None:
            try:
                while (await websocket.receive())["type"] != "websocket.disconnect":
                    pass  # the stats socket reads nothing; it only notices the peer leaving
            except (WebSocketDisconnect, RuntimeError):
                pass
            finally:
                gone.set()

        reader = asyncio.create_task(read_until_gone())
        self.sockets.add(websocket)
        first = True
        try:
            while not gone.is_set():
                if self.hub.shutting_down:
                    await websocket.close(CloseCode.GOING_AWAY, "server shutting down")
                    break
                await websocket.send_bytes(self.first_frame() if first else self.frame())
                first = False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await gone.wait()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the peer left, or close_all closed the socket between two frames
        finally:
            self.sockets.discard(websocket)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def close_all(self, code: CloseCode, reason: str) -> None:
        await asyncio.gather(*(_close(ws, code, reason) for ws in list(self.sockets)))


async def _close(websocket: WebSocket, code: CloseCode, reason: str) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.close(code, reason)

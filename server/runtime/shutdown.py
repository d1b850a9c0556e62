"""Graceful shutdown (PROTOCOL.md "Limits"): ``goaway``, no new prompts, ``/readyz`` 503
``draining`` (a load balancer takes the replica out), a grace period for the generations already
running, ``done`` reason ``cancelled`` for the rest, then close 1001. With a session store that
other replicas share (Redis), each session is left there detached, as a dropped connection
leaves it, so its client resumes on another replica; with the in-memory store it is closed.

``GracefulServer`` runs ``drain`` on the first SIGTERM/SIGINT and lets uvicorn exit when it is
over; a second signal exits at once. No peer can hold the exit up: the drain has a hard deadline
of the grace period plus ``CLOSE_S``, after which the connections still open are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from wschat.protocol import CloseCode, GoAway

from ..sessions import Door, Hub, Session, SessionState
from ..web.stats_feed import StatsFeed
from .transport import handle_loop_exception

log = logging.getLogger("wschat.shutdown")

SHUTTING_DOWN = "the server is shutting down"
# after the grace period: time for the last done frames and close handshakes
CLOSE_S = 5


async def drain(hub: Hub, stats_feed: StatsFeed, grace_s: float) -> None:
    hub.shutting_down = True
    hub.slots.closed_reason = SHUTTING_DOWN
    connections = list(hub.connections)
    log.info("shutting down: %d connections, %.1f s grace", len(connections), grace_s)
    # each goaway on its own: a peer that does not read delays no one else's grace period
    notices = [asyncio.create_task(c.send(GoAway(int(grace_s * 1000)))) for c in connections]
    # the chats' sessions, and the HTTP API's requests (web/openai_api), which have no socket
    sessions = [*(c.session for c in connections), *hub.requests]
    for session in sessions:
        if session.state is SessionState.QUEUED:
            session.cancel_run()  # it would start after the deadline anyway
    running = {t for s in sessions if (t := session_task(s)) is not None}
    await hub.stop_held_replies()  # no connection to finish them for: cancelled at once
    if running:
        _, late = await asyncio.wait(running, timeout=grace_s)
        if late:
            log.info("shutting down: cancelling %d generations past the grace period", len(late))
    # each connection on its own again: one whose done frame cannot be sent holds up only its
    # own close (until the deadline in GracefulServer)
    keep = hub.sessions.shared
    await asyncio.gather(
        *(_end(c, keep) for c in connections),
        *(session.stop_generation() for session in list(hub.requests)),
        stats_feed.close_all(CloseCode.GOING_AWAY, "server shutting down"),
    )
    for notice in notices:
        notice.cancel()


async def _end(connection: Door, keep: bool) -> None:
    """Stop its reply and close it; ``keep``: the session outlives this process (the end of the
    connection detaches it to the shared store, app.py), else it is closed for good."""
    session = connection.session
    await (session.stop_generation() if keep else session.close())
    await connection.close(CloseCode.GOING_AWAY, "server shutting down")


def session_task(session: Session) -> asyncio.Task[None] | None:
    task = session.generation_task
    return task if task is not None and not task.done() else None


class GracefulServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, hub: Hub, stats_feed: StatsFeed, grace_s: float
    ) -> None:
        super().__init__(config)
        self.hub = hub
        self.stats_feed = stats_feed
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self.shutdown_started_at: float | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(handle_loop_exception)
        await super().serve(sockets)

    async def on_tick(self, counter: int) -> bool:
        # A model that failed to load never will: stop serving (``serve`` exits 1) rather than
        # close every chat with "still loading" while orchestrators see a healthy process.
        if self.hub.load_error is not None and not self.should_exit:
            log.error("exiting: the model failed to load")
            self.should_exit = True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after the loop ends and
        # the process would die of the signal instead of exiting 0.
        if self.shutdown_started_at is not None or self._loop is None:
            log.warning("second %s: exiting now", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True
            return
        self.shutdown_started_at = time.monotonic()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            async with asyncio.timeout(self.grace_s + CLOSE_S):
                await drain(self.hub, self.stats_feed, self.grace_s)
        except TimeoutError:
            self._drop_websockets()
        except Exception:
            log.exception("draining connections failed")
        finally:
            self.should_exit = True

    def _drop_websockets(self) -> None:
        stuck = [
            c
            for c in self.server_state.connections
            if isinstance(c, WebSocketsSansIOProtocol) and not c.disconnected
        ]
        log.warning("shutting down: dropping %d connections that did not close in time", len(stuck))
        for connection in stuck:
            connection.transport.abort()

"""Graceful shutdown (PROTOCOL.md "Limits"): ``goaway``, no new prompts, a grace period for the
generations already running, ``done`` reason ``cancelled`` for the rest, then close 1001.

``GracefulServer`` runs ``drain`` on the first SIGTERM/SIGINT and lets uvicorn exit when it is
over; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn
from wschat.protocol import CloseCode, GoAway

from .hub import Hub

log = logging.getLogger("wschat.shutdown")

SHUTTING_DOWN = "the server is shutting down"


async def drain(hub: Hub, grace_s: float) -> None:
    hub.shutting_down = True
    hub.slots.closed_reason = SHUTTING_DOWN
    connections = list(hub.connections)
    log.info("shutting down: %d connections, %.1f s grace", len(connections), grace_s)
    await asyncio.gather(*(c.send(GoAway(int(grace_s * 1000))) for c in connections))
    sessions = [c.session for c in connections if getattr(c, "session", None)]
    for session in sessions:
        if session.run is not None and session.run.started_at is None:
            session.run.cancel()  # still queued: it would start after the deadline anyway
    running = {t for s in sessions if (t := session_task(s)) is not None}
    if running:
        _, late = await asyncio.wait(running, timeout=grace_s)
        if late:
            log.info("shutting down: cancelling %d generations past the grace period", len(late))
    await asyncio.gather(*(s.stop_generation() for s in sessions))
    await asyncio.gather(
        *(c.close(CloseCode.GOING_AWAY, "server shutting down") for c in connections)
    )


def session_task(session: object) -> asyncio.Task[None] | None:
    task = getattr(session, "generation_task", None)
    return task if task is not None and not task.done() else None


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, hub: Hub, grace_s: float) -> None:
        super().__init__(config)
        self.hub = hub
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self.shutdown_started_at: float | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

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
            await drain(self.hub, self.grace_s)
        except Exception:
            log.exception("draining connections failed")
        finally:
            self.should_exit = True

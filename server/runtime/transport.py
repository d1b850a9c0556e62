"""The HTTP and WebSocket protocols under the app: uvicorn's, with the bounds they lack.

uvicorn waits for a peer without limit: for the rest of an HTTP request, for a full send buffer
to drain (its ``send`` awaits ``resume_writing``), for a closing transport to flush. A peer that
never finishes its request or stops reading would hold a descriptor, a task and, on a chat
connection, a generation slot for good (README "Security and limits"). Here:

- ``BoundedHTTPProtocol`` (http_protocol.py): deadlines for a request's head and body, and
  places for the connections still sending theirs.
- ``BoundedWebSocketProtocol``: a send buffer that stays full for ``send_timeout_s``, or a
  transport still flushing that long after it was closed, aborts the connection; the app sees a
  disconnect and its generation is cancelled. The app may also drop a connection at once, and
  wait until what it wrote has left the send buffer (``TRANSPORT_EXTENSION`` in the scope): a
  resume drops the one it replaces, and a replay holds its turn until the peer took it. Pings
  and pongs are limited to ``frames_per_second`` like messages (each ping queues a pong that a
  peer that does not read never takes): past it, close 1008. permessage-deflate is not offered
  (``uvicorn_config``).
- Every accepted connection gets ``TCP_NODELAY``: a reply is a stream of small frames, and
  without it a frame written while the previous one is unacknowledged waits for the peer's
  delayed ACK. asyncio sets it only on sockets created with ``IPPROTO_TCP`` (not a socket
  made as ``socket.socket()`` and handed to uvicorn).
- ``handle_loop_exception``: when descriptors run out, asyncio logs a traceback for every failed
  accept, a backlog's worth (2,048) a second; here one line per interval. ``raise_descriptor_limit``
  lifts the soft limit to the hard one at start and says when the caps could still reach it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame
from websockets.http11 import Request
from wschat.protocol import CloseCode

from ..sessions import FrameRate
from ..settings import Settings
from ..web.connection import TRANSPORT_EXTENSION

log = logging.getLogger("wschat.transport")

LOG_INTERVAL_S = 10.0
ACCEPT_FAILED = "socket.accept() out of system resource"
# descriptors besides connections: the listening socket, logs, the model's files, pipes
DESCRIPTOR_RESERVE = 64


class RateLimitedLog:
    """A warning at most once per ``interval_s``; the next one says how many were left out."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._next_at = float("-inf")
        self.left_out = 0

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        if now < self._next_at:
            self.left_out += 1
            return
        if self.left_out:
            message += f" ({self.left_out} more in the last {self.interval_s:.0f} s)"
        self.logger.warning(message, *args)
        self._next_at = now + self.interval_s
        self.left_out = 0


_accept_log = RateLimitedLog(log)
_stuck_log = RateLimitedLog(log)


def handle_loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: failed accepts (descriptors exhausted) rate-limited,
    anything else as asyncio logs it."""
    if context.get("message") == ACCEPT_FAILED:
        _accept_log.warning("cannot accept connections: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)


def raise_descriptor_limit(settings: Settings) -> int:
    """Lift the soft limit on open descriptors to the hard one; warn when the connection caps
    can still reach it (connections past it wait in the listen backlog). Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    needed = settings.max_connections + settings.max_pending_handshakes + DESCRIPTOR_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "%d open files allowed, fewer than the caps can use (%d connections + %d pending"
            " handshakes + %d): lower the caps or raise the limit (ulimit -n)",
            soft,
            settings.max_connections,
            settings.max_pending_handshakes,
            DESCRIPTOR_RESERVE,
        )
    return soft


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Send each write at once (module docstring); a socket that is not TCP is left alone."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Deadline:
    """``callback`` once ``seconds`` have passed since ``arm``, unless ``disarm`` came first;
    arming an armed deadline keeps its time."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, callback: Callable[[], None]
    ) -> None:
        self.loop, self.seconds, self.callback = loop, seconds, callback
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self._handle is None:
            self._handle = self.loop.call_later(self.seconds, self._expire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        self.callback()


class StuckPeerGuard(asyncio.Protocol):
    """Aborts a transport whose send buffer stays full, or that is still flushing after it was
    closed, for ``send_timeout_s``: the peer has stopped reading. Mixed into both protocols."""

    send_timeout_s: ClassVar[float]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # armed while the send buffer is full or the transport is closing with data unsent;
        # disarmed when the buffer drains or the connection is gone
        self.stuck = Deadline(self.loop, self.send_timeout_s, self._abort)

    def pause_writing(self) -> None:
        super().pause_writing()
        self.stuck.arm()

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.transport.is_closing():
            self.stuck.disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.stuck.disarm()

    def _abort(self) -> None:
        _stuck_log.warning("dropped a connection that took nothing for %.0f s", self.send_timeout_s)
        self.transport.abort()


class BoundedWebSocketProtocol(StuckPeerGuard, WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol that drops a peer it cannot write to, and counts
    control frames against the frame rate."""

    frames_per_second: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control_rate = FrameRate(self.frames_per_second)

    # -- a peer that does not read ---------------------------------------------------------

    # Every path that closes the transport runs under one of these; a close waits for the send
    # buffer to flush, which a peer that does not read never lets happen.
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_closing()

    async def send(self, message: Any) -> None:
        try:
            await super().send(message)
        finally:
            if message.get("type") == "websocket.close" and self.close_timer is not None:
                self.close_timer.cancel()  # uvicorn's timer would close, and wait on the peer
                self.close_timer = self.loop.call_later(self.close_timeout, self._close_now)
            self._watch_closing()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        self._watch_closing()

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()
        self._watch_closing()

    def shutdown(self) -> None:
        super().shutdown()
        self._watch_closing()

    def _close_now(self) -> None:
        self.close_timer = None
        self.transport.close()
        self._watch_closing()

    def _watch_closing(self) -> None:
        if self.transport.is_closing() and not self.disconnected:
            self.stuck.arm()

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        extensions = self.scope.get("extensions") if self.response.status_code == 101 else None
        if extensions is not None:
            extensions[TRANSPORT_EXTENSION] = {
                "drop": _dropper(self.transport),
                "drained": self.writable.wait,  # set below the low-water mark, and when lost
            }

    # -- messages ---------------------------------------------------------------------------

    # websockets' parser keeps the frame it parsed last in a local until the next one arrives,
    # so an idle connection would keep its last message (up to ws_max_size, inflated) for good.
    # The app has its own reference to the data; the frame lets go of it.
    def handle_text(self, event: Frame) -> None:
        super().handle_text(event)
        event.data = b""

    def handle_bytes(self, event: Frame) -> None:
        super().handle_bytes(event)
        event.data = b""

    def handle_cont(self, event: Frame) -> None:
        super().handle_cont(event)
        event.data = b""

    # -- control frames ----------------------------------------------------------------------

    def handle_ping(self) -> None:
        if self._allow_control_frame():
            super().handle_ping()

    def handle_pong(self, event: Frame) -> None:
        if self._allow_control_frame():
            super().handle_pong(event)

    def _allow_control_frame(self) -> bool:
        if self.control_rate.allow():
            return True
        if not self.close_sent:
            self._fail(CloseCode.POLICY_VIOLATION, "too many frames")
        return False

    def _fail(self, code: CloseCode, reason: str) -> None:
        """Close at once without the app: later input is discarded, the app sees a disconnect."""
        self.conn.fail(code, reason)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()


def _dropper(transport: asyncio.Transport) -> Callable[[], None]:
    """Aborts ``transport`` while it exists: held weakly, as a session keeps this past its
    connection (sessions/relay.py ``drop_last``)."""
    ref = weakref.ref(transport)

    def drop() -> None:
        if (alive := ref()) is not None:
            alive.abort()

    return drop


def websocket_protocol(settings: Settings) -> type[BoundedWebSocketProtocol]:
    """The WebSocket protocol class for one server, with its limits."""

    class WebSocketProtocol(BoundedWebSocketProtocol):
        send_timeout_s = settings.send_timeout_s
        frames_per_second = settings.frames_per_second

    return WebSocketProtocol

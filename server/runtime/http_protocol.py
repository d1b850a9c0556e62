"""uvicorn's h11 protocol with the bounds it lacks (README "Security and limits").

uvicorn waits without limit for a request's body, and counts no connection that is still
sending its request. Here:

- a request's head must arrive whole within ``handshake_timeout_s`` (at the start and between
  kept-alive requests: else the connection is dropped), and its body within ``body_timeout_s``
  of the head: else 408 in the API's error shape and the connection closed, the app reading a
  disconnect. A body the app never reads (a refusal answered first) has the same deadline.
- a connection holds a pending place from its arrival until its first request is whole, and
  again while a later request's body arrives (``quotas.PendingHandshakes``:
  ``max_pending_handshakes`` places; when all are taken, a newcomer from an address under its
  share, ``max_pending_handshakes_per_client``, takes the oldest place of the address holding
  the most, so a health check or a chat from another address always gets in). A connection that
  finds no place is dropped on arrival; a later body is answered 429.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from wschat.protocol import Overloaded

from ..sessions import PendingHandshakes, PendingPlace
from ..settings import Settings
from ..web.openai_api.errors import ApiError
from .transport import Deadline, RateLimitedLog, StuckPeerGuard, log, no_delay

_arrival_log = RateLimitedLog(log)
_evicted_log = RateLimitedLog(log)


class BoundedHTTPProtocol(StuckPeerGuard, H11Protocol):
    """h11 with deadlines for each request's head and body, a share of the pending places per
    address, and no response waiting on a peer that does not read."""

    handshake_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]
    pending: ClassVar[PendingHandshakes]  # connections whose request is still arriving

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # armed while waiting for a request's head: at the start and between keep-alive requests
        self.request_due = Deadline(self.loop, self.handshake_timeout_s, self._timed_out)
        # armed from a request's head until its body is whole
        self.body_due = Deadline(self.loop, self.body_timeout_s, self._body_timed_out)
        self.place: PendingPlace | None = None  # held while a request arrives
        self.upgraded = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        no_delay(transport)
        refused = self._take_place()
        if refused is not None:
            _arrival_log.warning("dropped a connection on arrival (handshakes: %s)", refused)
            transport.abort()
            return
        self.request_due.arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self.upgraded = True
        self._release()
        self.request_due.disarm()
        super().handle_websocket_upgrade(event)
        self.stuck.disarm()  # the transport is the WebSocket protocol's now, with its own guard

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may take a pipelined request's head and body
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.request_due.arm()  # keep-alive: the next request has the same deadline
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.request_due.disarm()
        self.body_due.disarm()
        self._release()

    def _follow_request(self) -> None:
        """After h11 read: the head's and the body's deadlines and the pending place, as the
        request's state says."""
        state = self.conn.their_state
        if self.upgraded or state is h11.IDLE or self.transport.is_closing():
            return  # a head still due: its deadline runs, its place is held
        self.request_due.disarm()
        if state is not h11.SEND_BODY:
            self.body_due.disarm()
            self._release()
            return
        self.body_due.arm()
        if self.place is None:  # a body on a kept-alive connection is pending again
            refused = self._take_place()
            if refused is not None:
                _arrival_log.warning("refused a request body (handshakes: %s)", refused)
                self._answer_and_close(ApiError.of(Overloaded(f"pending requests: {refused}")))

    def _take_place(self) -> str | None:
        """A pending place for this connection; or why there is none."""
        evicted = self.pending.dropped_for_newcomers
        taken = self.pending.acquire(self._address(), self.transport.abort)
        if self.pending.dropped_for_newcomers != evicted:
            _evicted_log.warning(
                "all %d pending places taken: dropped the oldest of the address holding the most"
                " for a newcomer",
                self.pending.max_total,
            )
        if isinstance(taken, str):
            return taken
        self.place = taken
        return None

    def _release(self) -> None:
        if self.place is not None:
            self.pending.release(self.place)
            self.place = None

    def _address(self) -> str:
        return self.client[0] if self.client else "unknown"

    def _timed_out(self) -> None:
        if self.conn.their_state is h11.IDLE:
            log.debug("dropped a connection: no whole request in %.0f s", self.handshake_timeout_s)
            self.transport.abort()

    def _body_timed_out(self) -> None:
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            seconds = self.body_timeout_s
            log.debug("closed a connection: no whole request body in %.0f s", seconds)
            message = f"the request body did not arrive whole within {seconds:g} s"
            self._answer_and_close(ApiError(message, status=408, code="request_timeout"))

    def _answer_and_close(self, error: ApiError) -> None:
        """Answer ``error`` in the API's shape and close, the app's request ended as if its client
        left; a connection whose response has begun is closed (dropped if it is unfinished)."""
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            if cycle.response_complete:
                self.transport.close()
            else:
                self.transport.abort()
            return
        if cycle is not None:  # the app reads a disconnect; what it sends is discarded
            cycle.disconnected = True
            cycle.message_event.set()
        response = error.response()
        response.headers["connection"] = "close"
        reason = HTTPStatus(error.status).phrase
        head = h11.Response(status_code=error.status, headers=response.raw_headers, reason=reason)
        for event in (head, h11.Data(data=bytes(response.body)), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


def http_protocol(settings: Settings) -> type[BoundedHTTPProtocol]:
    """The HTTP protocol class for one server: its limits and its own count of pending
    handshakes."""

    class HTTPProtocol(BoundedHTTPProtocol):
        send_timeout_s = settings.send_timeout_s
        handshake_timeout_s = settings.handshake_timeout_s
        body_timeout_s = settings.body_timeout_s
        pending = PendingHandshakes(
            settings.max_pending_handshakes, settings.max_pending_handshakes_per_client
        )

    return HTTPProtocol

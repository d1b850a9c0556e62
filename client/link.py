"""``Link``: a ``Chat``'s connection to its session, and the two tasks that run on it.

A reader decodes every server frame and hands it to the ``FrameRouter``; a writer sends queued
frames in the order they were asked for, so an answer without ``id`` always matches the request
registered with it.

A dropped connection (no close frame from the server) is resumed when ``connect`` says so
(PROTOCOL.md section 10): the reader opens the session again through ``reopen``, naming the last
token index of the reply in flight, and goes on reading; the writer waits for the new connection
and sends what was queued meanwhile. The reply in flight goes on where it was (each piece once);
a reply the server did not resume ends with ``ReplyLostError``; requests still waiting for an
answer end with ``ConnectionClosedError`` (their answer may have been lost). A resume that fails
ends everything as a close does.

A server going away is left the same way (PROTOCOL.md section 11): after its ``goaway`` the reply
running there finishes there (within the server's grace period), and once nothing sent waits for
an answer the reader closes with 1001 and resumes the session elsewhere (a replica that shares
the session store); a frame queued meanwhile goes out on the new connection. So does a close
1001 (the end of a drain) or 1012 (a restart) from the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from wschat.protocol import CloseCode, ProtocolError, Ready, decode_server_frame

from .connection import FrameRouter
from .errors import ConnectionClosedError
from .reply import Reply

log = logging.getLogger("wschat.client")

_CLOSED = object()

# (the ready of the session that dropped, the last token index of its reply in flight) -> the
# connection resumed and its ready, or None when it could not be resumed
Reopen = Callable[[Ready, int | None], Awaitable[tuple[ClientConnection, Ready] | None]]
# Closes by a server that is going away, not ending the session: it resumes elsewhere. 1001 ends a
# drain (PROTOCOL.md section 11); 1012 (service restart) is what uvicorn and proxies send.
SERVICE_RESTART = 1012
MOVING_CLOSES = frozenset({CloseCode.GOING_AWAY, SERVICE_RESTART})


class Link:
    """The connection a ``Chat`` talks over, replaced by a new one when a resume succeeds."""

    def __init__(
        self,
        ws: ClientConnection,
        ready: Ready,
        router: FrameRouter,
        *,
        reopen: Reopen | None = None,
        on_resume: Callable[[Ready], None] | None = None,
    ) -> None:
        self.ws = ws
        self.ready = ready  # the last ``ready``: a resume's gives a new token
        self.router = router
        self.resumes = 0  # connections dropped or left, and resumed, so far
        self._reopen = reopen
        self._on_resume = on_resume
        self._closing = False  # close() was called: an end is not a drop
        self._leaving = False  # set on goaway (``leave``), cleared by a resume
        self._resuming = False  # the reader is opening the session again
        self._swapped = asyncio.Event()  # set by the reader on a new connection, or the end
        # frames to send; a prompt's comes with its reply, which learns it was sent
        self._outbox: asyncio.Queue[bytes | tuple[bytes, Reply] | object] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read(), name="wschat-client-reader")
        self._writer = asyncio.create_task(self._write(), name="wschat-client-writer")

    def leave(self) -> None:
        """The server is going away: leave it once nothing sent waits for an answer."""
        self._leaving = self._reopen is not None

    def send(self, data: bytes, reply: Reply | None = None) -> None:
        """Queue a frame (a prompt's with its ``reply``); the writer sends it in turn."""
        self._outbox.put_nowait(data if reply is None else (data, reply))

    async def _write(self) -> None:
        while (item := await self._outbox.get()) is not _CLOSED:
            data, reply = item if isinstance(item, tuple) else (item, None)
            assert isinstance(data, bytes)
            if reply is not None:
                reply.sent = True
            ws = self.ws
            try:
                await ws.send(data)
            except ConnectionClosed:
                # lost with the connection; the reader resumes it (or ends everything)
                while self.ws is ws and self.router.closed is None:
                    self._swapped.clear()
                    await self._swapped.wait()
                if self.router.closed is not None:
                    return

    async def _read(self) -> None:
        try:
            while True:
                await self._read_connection()
                if not await self._resumed():
                    break
        finally:
            self.router.close(
                ConnectionClosedError(
                    self.ws.close_code,
                    self.ws.close_reason or "",
                    error=self.router.unclaimed_error,
                )
            )
            self._swapped.set()
            self._outbox.put_nowait(_CLOSED)

    async def _read_connection(self) -> None:
        """Route every frame of the current connection until it ends."""
        try:
            async for message in self.ws:
                if isinstance(message, str):
                    log.warning("ignored a text message from the server")
                    continue
                try:
                    frame = decode_server_frame(message)
                except ProtocolError as error:  # a newer server's frame type, or a broken one
                    log.warning("ignored a server frame that does not decode: %s", error.message)
                    continue
                self.router.route(frame)
                if self._leaving and self.router.idle and not self._closing:
                    await self.ws.close(CloseCode.GOING_AWAY, "the server is going away")
        except ConnectionClosed:
            pass

    def _moving(self) -> bool:
        """The connection ended, and not as the end of the session: it dropped (no close frame
        from the server), or the server is going away."""
        received = self.ws.protocol.close_rcvd
        return received is None or received.code in MOVING_CLOSES or self._leaving

    async def _resumed(self) -> bool:
        """After the connection ended: True once a dropped or left one is resumed (PROTOCOL.md
        section 10); False when it was closed, or could not be resumed."""
        if self._closing or self._reopen is None or not self._moving():
            return False
        ended = ConnectionClosedError(
            self.ws.close_code, self.ws.close_reason or "the connection dropped"
        )
        self.router.fail_requests(ended)
        replies = [r for r in self.router.replies.values() if r.sent]
        in_flight = next((r for r in replies if r.accepted), replies[-1] if replies else None)
        self._resuming = True
        try:
            opened = await self._reopen(self.ready, in_flight.last_index if in_flight else None)
        finally:
            self._resuming = False
        if opened is None:
            return False
        self.ws, self.ready = opened
        self.resumes += 1
        self._leaving = False
        for lost in self.router.resumed(self.ready.resumed):
            assert lost.prompt_frame is not None
            self.send(lost.prompt_frame, lost)  # the server never had it
        self._swapped.set()
        if self._on_resume is not None:
            self._on_resume(self.ready)
        return True

    async def close(self) -> None:
        """Close the connection (1000) and wait for both tasks to end."""
        self._closing = True
        if self._resuming:
            self.reader.cancel()  # no connection to close: stop trying
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader
        self._outbox.put_nowait(_CLOSED)
        await self._writer

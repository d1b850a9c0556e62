"""``Connection``: the WebSocket glue around one ``Session``.

It reads frames while a generation streams (so ``cancel`` and ``ping`` work mid-reply), decodes
them with the protocol's limits and feeds them to the session; what the session sends, and the
``error`` frame of whatever a frame raised, leave through one ``Outbox`` (error_boundary.py),
which counts every ``error`` (PROTOCOL.md "Errors": the session goes on). It also enforces what
is per connection (PROTOCOL.md "Limits"): the frame rate (a flood is closed with 1008) and the idle
timeout (no frame and no generation: close 1000).

How it ended decides what becomes of a reply in flight (PROTOCOL.md section 10): a close frame
from the peer with 1000 or 1001, or a close of ours, cancels it at once; a drop (no close frame,
a missed keepalive ping, another close code) lets it go on for ``--resume-grace-s`` for a
resume to pick up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect
from wschat.protocol import (
    VERSION,
    BadFrame,
    Capabilities,
    ClientFrame,
    CloseCode,
    DecodeLimits,
    Frame,
    Limits,
    Overloaded,
    ProtocolError,
    Ready,
    Resumed,
    decode_client_frame,
    encode,
)

from ..sessions import CatchUp, FrameRate, Hub, Outbox, Session, TakenOver, expected

log = logging.getLogger("wschat.connection")

# a peer's close codes that end its reply at once; any other end is a drop (section 10)
CLEAN_CLOSES = frozenset({CloseCode.NORMAL, CloseCode.GOING_AWAY})
# The ASGI scope extension under which the transport (runtime/transport.py) gives
# {"drop": callable}: drops the connection at once, with whatever it has not sent yet;
# {"drained": coroutine function}: returns once what was written has left the send buffer (below
# its low-water mark) or the connection is gone.
TRANSPORT_EXTENSION = "wschat.transport"


class Connection:
    def __init__(self, websocket: WebSocket, hub: Hub, session: Session) -> None:
        self.ws = websocket
        self.hub = hub
        self.session = session
        self.closed = False
        # the peer closed with a code of CLEAN_CLOSES, or we closed: not a drop
        self.clean_end = False
        self._send_lock = asyncio.Lock()  # one frame at a time on the socket, in order
        self.outbox = Outbox(self._send_now, hub.stats.count_error)
        # a message that came while a resume's catch-up waited its turn: handled first after it
        self._early: Message | None = None
        # a replay's send buffer draining: its end ends the replay's turn (_drain_then_release)
        self._draining: asyncio.Future[object] | None = None
        s = hub.settings
        self.rate = FrameRate(s.frames_per_second)
        self.last_frame_at = time.monotonic()
        # PROTOCOL.md section 2: room for params.tools' schemas, whose own caps the protocol
        # checks once decoded (protocol/tools.py)
        self.limits = DecodeLimits(
            max_frame_bytes=s.max_frame_bytes,
            max_str_len=max(s.max_prompt_bytes, 4096),
            max_bin_len=s.max_image_bytes,
            max_array_len=max(64, s.max_images),
            max_map_len=64,
            max_containers=1024,
        )

    async def send(self, frame: Frame) -> None:
        """Send through the outbox (an ``error`` is counted)."""
        await self.outbox(frame)

    async def _send_now(self, frame: Frame) -> None:
        """Send, or do nothing once the peer is gone: senders never fail on a dead socket."""
        if self.closed:
            return
        async with self._send_lock:
            try:
                await self.ws.send_bytes(encode(frame))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True

    async def serve(
        self, resume_token: str, taken_over: TakenOver | None = None, last: int | None = None
    ) -> None:
        """Serve its session until the connection ends. ``taken_over``: by a resume (whose
        ``last`` is the index of the last ``token`` frame the client got)."""
        session = self.session
        catch_up = session.connect(self._drop_transport(), taken_over, last)
        try:
            if await self._open(session, resume_token, catch_up):
                while not self.closed and await self._handle_next():
                    pass
        except WebSocketDisconnect as e:
            self.clean_end = self.clean_end or e.code in CLEAN_CLOSES
        finally:
            self.closed = True
            await session.disconnect(0.0 if self.clean_end else self._grace_s())

    async def _open(self, session: Session, resume_token: str, catch_up: CatchUp | None) -> bool:
        """``ready``, what a resumed reply's client missed, then the session's frames live;
        False when the peer left while the catch-up waited its turn."""
        ready = self._ready(session, resume_token)
        if catch_up is not None:
            resumed = Resumed(session.core.last_prompt, catch_up.reply, session.chat.turns)
            ready = dataclasses.replace(ready, resumed=resumed)
        await self.send(ready)
        if catch_up is not None and catch_up.frames:
            if not await self._replay_turn():
                return False
            try:
                for frame in catch_up.frames:
                    await self.send(frame)
            finally:
                self._drain_then_release()
        await session.attach(self.outbox)
        return True

    async def _replay_turn(self) -> bool:
        """Until the catch-up may be written (``hub.replays``): a replay (a token frame of all
        the client missed, a done that repeats the reply) is a copy of the reply until the peer
        takes it, so a few are written at once, server-wide. False when the peer left first.
        Meanwhile messages are read, so a peer that leaves is noticed (the session's next resume
        waits for the connection holding it to end); the first other message waits for the
        catch-up (nothing of the session goes before it), and reading stops there."""
        gate = self.hub.replays
        if gate.free:  # taken at once: the catch-up follows ready with nothing in between
            await gate.acquire()
            return True
        turn = asyncio.ensure_future(gate.acquire())
        message: asyncio.Future[Message] | None = None
        taken = False
        try:
            while self._early is None:
                message = asyncio.ensure_future(self.ws.receive())
                await asyncio.wait({turn, message}, return_when=asyncio.FIRST_COMPLETED)
                if not message.done():
                    break  # the turn came first
                # handled after the catch-up; a disconnect too, when the turn came with it
                self._early = message.result()
                if not turn.done() and self._early["type"] == "websocket.disconnect":
                    self.clean_end = self._early.get("code") in CLEAN_CLOSES
                    return False
            await turn
            taken = True
            return True
        finally:
            if message is not None and not message.done():
                message.cancel()  # a queue's get: cancelled, it takes nothing
            if not taken:
                turn.cancel()
                if turn.done() and not turn.cancelled() and turn.exception() is None:
                    gate.release()  # granted as the peer left

    def _drain_then_release(self) -> None:
        """The replay's turn ends once the peer has taken it or the connection is gone; the
        connection goes on meanwhile (it reads the peer's frames, a close among them)."""
        drained = self._transport("drained")
        if not callable(drained) or self.closed:
            self.hub.replays.release()
            return
        self._draining = asyncio.ensure_future(drained())
        self._draining.add_done_callback(lambda _: self.hub.replays.release())

    def _transport(self, name: str) -> Any:
        """What the transport gives under ``name`` (TRANSPORT_EXTENSION); None where it gives
        nothing."""
        extension = (self.ws.scope.get("extensions") or {}).get(TRANSPORT_EXTENSION) or {}
        return extension.get(name)

    def _drop_transport(self) -> Callable[[], None] | None:
        """What drops this connection's transport; None where the server gives nothing."""
        drop = self._transport("drop")
        return drop if callable(drop) else None

    def _grace_s(self) -> float:
        """How long a reply in flight goes on after a drop: none while shutting down, nor
        without a resume window."""
        s = self.hub.settings
        if self.hub.shutting_down or s.resume_window_s <= 0:
            return 0.0
        return s.resume_grace_s

    async def _handle_next(self) -> bool:
        """Receive and handle one message; False once the connection is over. The message's
        bytes are let go once decoded, before anything is awaited: held across a send or the
        next receive, they would pin up to twice max_frame_bytes per connection."""
        message, self._early = self._early or await self._receive_or_idle(), None
        if message is None:
            return False
        if message["type"] == "websocket.disconnect":
            self.clean_end = self.clean_end or message.get("code") in CLEAN_CLOSES
            return False
        self.last_frame_at = time.monotonic()
        if not self.rate.allow(self.last_frame_at):
            await self._flooded()
            return False
        decoded = self._decode(message.get("bytes"))
        del message
        await self._dispatch(decoded)
        return True

    async def _receive_or_idle(self) -> Message | None:
        """The next message; None once the connection was idle for ``idle_timeout_s`` (then it
        is closed). A running or queued generation is not idle, nor is the time it ran."""
        limit = self.hub.settings.idle_timeout_s
        while True:
            if limit <= 0:
                return await self.ws.receive()
            core = self.session.core
            busy_until = time.monotonic() if core.busy else core.last_active_at
            left = max(self.last_frame_at, busy_until) + limit - time.monotonic()
            if left > 0:
                try:
                    async with asyncio.timeout(left):
                        return await self.ws.receive()
                except TimeoutError:
                    continue
            await self.close(CloseCode.NORMAL, "idle")
            return None

    async def _flooded(self) -> None:
        per_s = self.hub.settings.frames_per_second
        await self.outbox.error(Overloaded(f"more than {per_s} frames in a second"))
        await self.close(CloseCode.POLICY_VIOLATION, "too many frames")

    async def close(self, code: CloseCode, reason: str) -> None:
        """Close once; later sends are dropped."""
        if self.closed:
            return
        async with self._send_lock:
            self.closed = True
            self.clean_end = True
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self.ws.close(code, reason)

    def _decode(self, data: bytes | None) -> ClientFrame | Exception:
        """The frame, or what was wrong with the bytes (``_dispatch`` reports it)."""
        try:
            if data is None:
                raise BadFrame("text messages are not frames: send msgpack as binary")
            return decode_client_frame(data, self.limits)
        except ProtocolError as error:
            return error.with_traceback(None)  # its frames would hold on to the bytes
        except Exception as error:
            return error  # a bug: where it happened goes to the log

    async def _dispatch(self, decoded: ClientFrame | Exception) -> None:
        if isinstance(decoded, ProtocolError):
            await self.outbox.error(decoded)
            return
        if isinstance(decoded, Exception):
            log.error("decoding a frame failed", exc_info=decoded)
            await self.outbox.error(decoded)
            return
        try:
            await self.session.handle(decoded)
        except Exception as error:
            if not expected(error):
                log.exception("session code failed on %s", type(decoded).__name__)
            # PROTOCOL.md "Errors": the id of the frame that caused it (e.g. a prompt's overloaded)
            await self.outbox.error(error, getattr(decoded, "id", None))

    def _ready(self, session: Session, resume_token: str) -> Ready:
        info = session.engine.info
        s = self.hub.settings
        return Ready(
            v=VERSION,
            session=session.key,
            resume=resume_token,
            model=info.model,
            capabilities=Capabilities(info.images, session.max_images),
            limits=Limits(
                max_frame_bytes=s.max_frame_bytes,
                max_image_bytes=s.max_image_bytes,
                context_tokens=info.context_tokens,
                max_new_tokens=s.max_new_tokens,
                max_image_pixels=s.max_image_pixels,
                max_images=session.max_images,
                max_prompt_bytes=s.max_prompt_bytes,
                max_prompt_tokens=s.max_prompt_tokens,
                frames_per_second=s.frames_per_second,
                idle_timeout_s=s.idle_timeout_s,
            ),
            engine=info.name,
            prompt_format=info.prompt_format or None,
            about=info.about or None,
        )

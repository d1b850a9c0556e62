"""``Connection``: the WebSocket glue around one ``Session``.

It reads frames while a generation streams (so ``cancel`` and ``ping`` work mid-reply), decodes
them with the protocol's limits, and is the one place where exceptions become ``error`` frames:
a ``ProtocolError`` keeps its code, anything else is logged and sent as ``internal`` with a
generic message (PROTOCOL.md "Errors": the session goes on).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol import (
    VERSION,
    BadFrame,
    Capabilities,
    ClientFrame,
    DecodeLimits,
    Error,
    ErrorCode,
    Frame,
    Limits,
    ProtocolError,
    Ready,
    decode_client_frame,
    encode,
)

from .hub import Hub
from .session import Session

log = logging.getLogger("wschat.connection")


class Connection:
    def __init__(self, websocket: WebSocket, hub: Hub) -> None:
        self.ws = websocket
        self.hub = hub
        self.closed = False
        self._send_lock = asyncio.Lock()  # one frame at a time on the socket, in order
        s = hub.settings
        self.limits = DecodeLimits(
            max_frame_bytes=s.max_frame_bytes,
            max_str_len=max(s.max_prompt_bytes, 4096),
            max_bin_len=s.max_image_bytes,
            max_array_len=max(16, s.max_images),
            max_map_len=32,
        )

    async def send(self, frame: Frame) -> None:
        """Send, or do nothing once the peer is gone: senders never fail on a dead socket."""
        if self.closed:
            return
        async with self._send_lock:
            try:
                await self.ws.send_bytes(encode(frame))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True

    async def serve(self, session: Session, resume_token: str) -> None:
        self.session = session
        session.send = self.send
        await self.send(self._ready(session, resume_token))
        try:
            while not self.closed:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self._dispatch(message.get("bytes"), message.get("text"))
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            await session.stop_generation()

    async def _dispatch(self, data: bytes | None, text: str | None) -> None:
        frame: ClientFrame | None = None
        try:
            if data is None:
                raise BadFrame("text messages are not frames: send msgpack as binary")
            frame = decode_client_frame(data, self.limits)
            await self.session.handle(frame)
        except ProtocolError as e:
            # PROTOCOL.md "Errors": the id of the frame that caused it (e.g. a prompt's overloaded)
            await self.report(e.code, e.message, e.id or getattr(frame, "id", None))
        except Exception:
            log.exception("session code failed on %s", type(frame).__name__)
            await self.report(ErrorCode.INTERNAL, "internal error", getattr(frame, "id", None))

    async def report(self, code: ErrorCode, message: str, frame_id: str | None) -> None:
        self.hub.stats.count_error(code.value)
        await self.send(Error(code, message, frame_id))

    def _ready(self, session: Session, resume_token: str) -> Ready:
        info = session.engine.info
        s = self.hub.settings
        return Ready(
            v=VERSION,
            session=session.key,
            resume=resume_token,
            model=info.model,
            capabilities=Capabilities(info.images, info.max_images),
            limits=Limits(
                max_frame_bytes=s.max_frame_bytes,
                max_image_bytes=s.max_image_bytes,
                context_tokens=info.context_tokens,
                max_new_tokens=s.max_new_tokens,
                max_image_pixels=s.max_image_pixels,
                max_images=info.max_images,
                max_prompt_bytes=s.max_prompt_bytes,
                max_prompt_tokens=s.max_prompt_tokens,
                frames_per_second=s.frames_per_second,
                idle_timeout_s=s.idle_timeout_s,
            ),
            engine=info.name,
        )

"""The Responses API's WebSocket mode at ``/v1/responses``: one long-lived socket,
``response.create`` events in (the body of an HTTP create, ``stream`` aside), each response's
events out as its SSE stream carries them, JSON text frames both ways.

A create may name a lane (``stream_id``, as the SDK's ``openai.lib.responses_websocket`` lanes
do): each lane runs its creates in turn, in the order they came; lanes run at once, each response
a row in the batch, their events interleaved. Each lane's responses run under one engine session
key for the socket's life, so a continuation on the lane (``previous_response_id``) goes on from
the KV state its last response left, as a chat session's next prompt does; the socket keeps each
lane's last response, whatever its ``store``, for a continuation (``store: false`` keeps nothing
past the socket). Closing the socket cancels what runs (the engine stops within a decode step)
and forgets its lanes' state.

Admission as for a chat socket (admission.py: the bearer token, Origin and Host, a place in the
connection caps), the chat API's limits on each create, and per socket: the frame rate (a flood
is closed with 1008), the idle timeout, ``--max-frame-bytes`` per message (past it, an ``error``
event ``too_large``; far past it, uvicorn closes 1009), ``MAX_LANES`` named lanes and
``MAX_WAITING`` creates waiting, of ``--max-frame-bytes`` in all (a socket holds no more of what
its client sent than a chat socket does); a response beside another that runs takes a place in
the connection caps while it runs, as an HTTP request does, and the lanes' last responses hold
at most what one chat session may. What the mode defines that is not served here
(``response.steer``, any other event type) and every refusal is an ``error`` event naming it,
with the lane's ``stream_id`` where it has one (a rate limit's is ``overloaded``, status 429),
and the socket goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect
from wschat.protocol import CloseCode, Overloaded, ProtocolError, TooLarge

from ...engine import EngineError
from ...sessions import RESPONSES_SOCKET, FrameRate, Hub
from ..access import owner_scope
from ..admission import Accept, serve_admitted
from ..openai_api import OpenAIApi
from ..openai_api.bodies import parse_json
from ..openai_api.errors import ApiError, unsupported
from ..openai_api.requests import shown
from .kept import Kept
from .request import CreateBody, create_body
from .run import Responses
from .shapes import Event, encoded

log = logging.getLogger("wschat.responses")

# Named lanes a socket may open (the default lane aside), as OpenAI's service allows
MAX_LANES = 32
# Creates waiting for their lane's response before them, all lanes together
MAX_WAITING = 16
# what a stream_id may be (the SDK checks the same)
STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# fields of a create that are the socket's, not the body's
_ENVELOPE = ("type", "stream_id", "stream")


@dataclass(eq=False)
class Lane:
    """A lane's creates, run in turn under its own engine session key."""

    stream_id: str | None
    key: str = field(default_factory=lambda: f"resp-ws-{secrets.token_hex(8)}")
    waiting: deque[tuple[CreateBody, int]] = field(default_factory=deque)  # (it, its bytes)
    task: asyncio.Task[None] | None = None
    active: bool = False  # a response of its runs or waits for a slot
    last: Kept | None = None  # its last response, for a continuation on the socket
    last_at: float = 0.0  # when it ended

    def acquire(self, prompt_ids: Sequence[int]) -> str:
        return self.key  # sessions.EngineKeys: every run of the lane under its key

    def release(self, key: str, ids: Sequence[int] | None) -> None:
        return None  # the engine keeps the lane's state under its key until the socket ends


async def serve_socket(
    websocket: WebSocket, hub: Hub, api: OpenAIApi, responses: Responses
) -> None:
    async def serve(accept: Accept) -> asyncio.Future[None] | None:
        await accept(())
        await ResponsesSocket(websocket, hub, api, responses).serve()
        return None

    await serve_admitted(websocket, hub, serve, needs_engine=True)


class ResponsesSocket:
    def __init__(self, ws: WebSocket, hub: Hub, api: OpenAIApi, responses: Responses) -> None:
        self.ws = ws
        self.hub = hub
        self.api = api
        self.responses = responses
        self.owner = owner_scope(ws, hub.settings.tokens)
        self.address = ws.client.host if ws.client else "unknown"
        self.lanes: dict[str | None, Lane] = {}
        self.closed = False
        self._send_lock = asyncio.Lock()  # one message at a time on the socket, in order
        self.rate = FrameRate(hub.settings.frames_per_second)
        self.last_frame_at = time.monotonic()
        self.last_active_at = time.monotonic()  # when its last response ended
        self.waiting_bytes = 0  # the messages of the creates waiting for their lanes

    async def serve(self) -> None:
        try:
            while not self.closed and await self._handle_next():
                pass
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            await self._end_lanes()

    async def _end_lanes(self) -> None:
        """What runs is cancelled and awaited (its slot given back), each lane's state forgotten."""
        for lane in self.lanes.values():
            lane.waiting.clear()
        self.waiting_bytes = 0
        running = [lane.task for lane in self.lanes.values() if lane.task is not None]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        engine = self.hub.engine
        for lane in self.lanes.values():
            if engine is not None:
                engine.forget(lane.key)

    @property
    def busy(self) -> bool:
        return any(lane.task is not None for lane in self.lanes.values())

    async def _handle_next(self) -> bool:
        message = await self._receive_or_idle()
        if message is None or message["type"] == "websocket.disconnect":
            return False
        self.last_frame_at = time.monotonic()
        if not self.rate.allow(self.last_frame_at):
            per_s = self.hub.settings.frames_per_second
            await self._error(ApiError.of(Overloaded(f"more than {per_s} messages in a second")))
            await self.close(CloseCode.POLICY_VIOLATION, "too many messages")
            return False
        text, data = message.get("text"), message.get("bytes")
        del message
        try:
            await self._handle(text.encode() if text is not None else data or b"")
        except (ApiError, ProtocolError, EngineError) as error:
            await self._error(ApiError.of(error))
        except Exception as error:  # a failure of ours: told as internal, the socket goes on
            log.exception("a message on a Responses socket failed")
            await self._error(ApiError.of(error))
        return True

    async def _receive_or_idle(self) -> Message | None:
        """The next message; None once the socket was idle (no message, nothing running) for
        ``idle_timeout_s``, and then it is closed."""
        limit = self.hub.settings.idle_timeout_s
        while limit > 0:
            busy_until = time.monotonic() if self.busy else self.last_active_at
            left = max(self.last_frame_at, busy_until) + limit - time.monotonic()
            if left <= 0:
                await self.close(CloseCode.NORMAL, "idle")
                return None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    return await self.ws.receive()
        return await self.ws.receive()

    async def _handle(self, data: bytes) -> None:
        limit = self.hub.settings.max_frame_bytes
        if len(data) > limit:
            too_large = f"a message is at most {limit} bytes; this one is {len(data)}"
            raise ApiError.of(TooLarge(too_large))
        engine = self.hub.engine
        assert engine is not None  # admitted: the model is loaded
        event, size = await parse_json(data, engine), len(data)
        del data
        kind = event.get("type") if isinstance(event, dict) else None
        if kind != "response.create":
            message = f"the event type {shown(kind)} is not served here; send response.create"
            raise unsupported(message, "type")
        stream_id = event.get("stream_id")
        try:
            lane = self._lane(stream_id)
            body = {k: v for k, v in event.items() if k not in _ENVELOPE}
            self._queue(lane, create_body(body, self.hub.settings), size)
        except ApiError as error:
            await self._error(error, stream_id if isinstance(stream_id, str) else None)

    def _lane(self, stream_id: Any) -> Lane:
        """The lane ``stream_id`` names (None: the default lane), opened on first use."""
        if stream_id is not None and (
            not isinstance(stream_id, str) or STREAM_ID.fullmatch(stream_id) is None
        ):
            message = "stream_id must be 1 to 256 ASCII letters, digits, '_', '-' or '.'"
            raise ApiError(message, param="stream_id", code="invalid_stream_id")
        lane = self.lanes.get(stream_id)
        if lane is None:
            if sum(key is not None for key in self.lanes) >= MAX_LANES and stream_id is not None:
                message = f"a socket may open at most {MAX_LANES} lanes (stream_id)"
                raise ApiError(message, param="stream_id", code="websocket_stream_limit_reached")
            lane = self.lanes[stream_id] = Lane(stream_id)
        return lane

    def _queue(self, lane: Lane, body: CreateBody, size: int) -> None:
        if self.hub.shutting_down:
            raise ApiError.of(Overloaded("the server is shutting down"))
        waiting = sum(len(lane.waiting) for lane in self.lanes.values())
        limit = self.hub.settings.max_frame_bytes
        if waiting >= MAX_WAITING or (waiting and self.waiting_bytes + size > limit):
            message = (
                f"at most {MAX_WAITING} creates, of {limit} bytes in all, may wait on a socket "
                "for their lanes"
            )
            raise ApiError.of(Overloaded(message))
        lane.waiting.append((body, size))
        self.waiting_bytes += size
        if lane.task is None:
            lane.task = asyncio.create_task(self._run_lane(lane))

    async def _run_lane(self, lane: Lane) -> None:
        try:
            while lane.waiting and not self.closed:
                body, size = lane.waiting.popleft()
                self.waiting_bytes -= size
                await self._respond(lane, body)
        finally:
            lane.task = None
            self.last_active_at = time.monotonic()

    async def _respond(self, lane: Lane, body: CreateBody) -> None:
        """One create on its lane: its events sent as they come, or its refusal."""
        try:
            placed = self._take_place(lane)
        except ApiError as error:
            await self._error(error, lane.stream_id)
            return
        lane.active = True
        try:
            await self._run(lane, body)
        finally:
            lane.active = False
            if placed:
                self.hub.caps.release(self.address)

    def _take_place(self, lane: Lane) -> bool:
        """A response beside another that runs on the socket counts as a connection of its
        client while it runs, as an HTTP request does (openai_api/in_flight.py): a socket of
        many lanes holds no more than that many connections would. True when it took one."""
        if not any(other.active for other in self.lanes.values() if other is not lane):
            return False  # the socket's own place is its first response's
        full = self.hub.caps.acquire(self.address)
        if full is not None:
            beside = "a response beside another on a socket counts as a connection until it ends"
            raise ApiError.of(Overloaded(f"{full}: {beside}"))
        return True

    async def _run(self, lane: Lane, body: CreateBody) -> None:
        try:
            previous = self._previous(body.previous_response_id)
            run = await self.responses.start(
                body,
                previous,
                owner=self.owner,
                address=self.address,
                keys=lane,
                api=RESPONSES_SOCKET,
                stream_id=lane.stream_id,
                on_kept=lambda kept: self._keep(lane, kept),
            )
        except (ApiError, ProtocolError, EngineError) as error:
            await self._error(ApiError.of(error), lane.stream_id)
            return
        task = run.reply.session.generation_task
        try:
            first = await run.first()
            if isinstance(first, ApiError):
                await self._error(first, lane.stream_id)
                return
            await run.send_events(self._send_event)
        except Exception as error:  # a failure of ours: the lane is told, and goes on
            log.exception("response %s failed", run.id)
            await self._error(ApiError.of(error), lane.stream_id)
        finally:
            run.reply.cancel()  # nothing if it ended; the socket is gone
            if task is not None:  # its state is the lane's once it ended: then the next create
                await asyncio.shield(task)

    def _keep(self, lane: Lane, kept: Kept) -> None:
        """``kept`` as its lane's last; the other lanes' last ones, least recently ended first,
        let go while all of them are over what one chat session may hold
        (``--max-session-image-bytes``, and ``--max-frame-bytes`` of text)."""
        lane.last, lane.last_at = kept, time.monotonic()
        s = self.hub.settings
        budget = s.max_session_image_bytes + s.max_frame_bytes
        held = sorted((o for o in self.lanes.values() if o.last), key=lambda o: o.last_at)
        total = sum(o.last.size for o in held if o.last is not None)
        for other in held:
            if total <= budget or other is lane:
                break
            total -= other.last.size if other.last is not None else 0
            other.last = None

    def _previous(self, response_id: str | None) -> Kept | None:
        """The response a create continues: a lane's last on this socket, else a kept one."""
        if response_id is None:
            return None
        for lane in self.lanes.values():
            if lane.last is not None and lane.last.id == response_id:
                return lane.last
        return self.responses.previous(response_id, self.owner)

    async def _error(self, error: ApiError, stream_id: str | None = None) -> None:
        if error.wire is not None:
            self.hub.stats.count_error(error.wire)
        event: dict[str, Any] = {"type": "error", "status": error.status, **error.body()}
        if stream_id is not None:
            event["stream_id"] = stream_id
        await self.send(event)

    async def send(self, event: dict[str, Any]) -> None:
        await self._send_text(encoded(event))

    async def _send_event(self, event: Event) -> bool:
        """A response's event sent; False once the peer is gone."""
        await self._send_text(event.data)
        return not self.closed

    async def _send_text(self, text: str) -> None:
        """Send, or do nothing once the peer is gone: senders never fail on a dead socket."""
        if self.closed:
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True

    async def close(self, code: CloseCode, reason: str) -> None:
        if self.closed:
            return
        async with self._send_lock:
            self.closed = True
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self.ws.close(code, reason)

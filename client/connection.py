"""``FrameRouter``: where each server frame goes, with no I/O of its own.

The server handles a session's frames one at a time and answers in order (PROTOCOL.md "Server
frames"), so answers that carry no ``id`` (``configured``, ``reset_ok``, ``rewound``, ``pong``
and the ``error`` that refuses a ``configure`` or a ``rewind``) match the oldest request still
waiting for one. Frames with an ``id`` go to the ``Reply`` of that generation, or to the
``image`` / ``cancel`` request that used it.

It also follows how many exchanges the conversation holds (``turns``), from the frames that
change it, so that exchanges can be named by their index without counting.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wschat.protocol import (
    Configured,
    Done,
    Error,
    FinishReason,
    GoAway,
    ImageOk,
    Pong,
    Queued,
    ResetOk,
    Resumed,
    Rewound,
    ServerFrame,
    Start,
    Token,
    ToolCall,
)

from .errors import (
    ChatError,
    ClientError,
    ConnectionClosedError,
    ReplyLostError,
    error_from_frame,
)
from .reply import Reply

log = logging.getLogger("wschat.client")

UNROUTED_KEPT = 64


@dataclass(eq=False)
class Waiter:
    """A request waiting for its answer; ``expects`` None: only an ``error`` can answer it."""

    expects: type[ServerFrame] | None
    future: asyncio.Future[ServerFrame] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def resolve(self, frame: ServerFrame) -> None:
        if not self.future.done():
            self.future.set_result(frame)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # marks it retrieved: a waiter that gave up logs nothing


class FrameRouter:
    def __init__(
        self, on_goaway: Callable[[GoAway], None] | None = None, turns: int | None = 0
    ) -> None:
        self.replies: dict[str, Reply] = {}
        # exchanges the conversation holds (PROTOCOL.md ``done.turn``); None: not known, as
        # after a server that does not say
        self.turns = turns
        self.goaway: GoAway | None = None
        self.closed: ConnectionClosedError | None = None
        # The last ``error`` that nothing claimed (e.g. a flood's ``overloaded`` before close 1008).
        self.unclaimed_error: ChatError | None = None
        # Frames that matched nothing live (late frames of a finished reply): for inspection.
        self.unrouted: deque[ServerFrame] = deque(maxlen=UNROUTED_KEPT)
        self._on_goaway = on_goaway
        self._by_id: dict[str, Waiter] = {}
        self._in_order: deque[Waiter] = deque()
        self._routes: dict[type[Any], Callable[[Any], None]] = {
            Token: self._to_reply,
            ToolCall: self._to_reply,
            Start: self._to_reply,
            Queued: self._to_reply,
            Done: self._on_done,
            Error: self._on_error,
            ImageOk: self._on_image_ok,
            Configured: self._on_in_order,
            ResetOk: self._on_reset_ok,
            Rewound: self._on_rewound,
            Pong: self._on_in_order,
            GoAway: self._on_goaway_frame,
        }

    # -- registering ---------------------------------------------------------------------------

    def add_reply(self, reply: Reply) -> None:
        self.replies[reply.id] = reply

    def expect(self, expects: type[ServerFrame] | None, id: str | None = None) -> Waiter:
        """A waiter for the answer to a request about to be sent (``id``: the request's id)."""
        waiter = Waiter(expects)
        if id is None:
            self._in_order.append(waiter)
        else:
            self._by_id[id] = waiter
        return waiter

    def forget(self, id: str) -> None:
        self._by_id.pop(id, None)

    @property
    def idle(self) -> bool:
        """Nothing sent waits for the server: no reply whose prompt left, no request."""
        sent = any(reply.sent for reply in self.replies.values())
        return not (sent or self._by_id or self._in_order)

    # -- routing -------------------------------------------------------------------------------

    def route(self, frame: ServerFrame) -> None:
        handler = self._routes.get(type(frame))
        if handler is None:
            self.unrouted.append(frame)
        else:
            handler(frame)

    def _to_reply(self, frame: Token | ToolCall | Start | Queued | Done) -> None:
        reply = self.replies.get(frame.id)
        if reply is None:
            self.unrouted.append(frame)
        else:
            self._feed(reply, frame)

    def _on_done(self, frame: Done) -> None:
        if frame.turn is not None:
            # a kept reply is the conversation's last exchange (only a suffix is ever dropped)
            self.turns = frame.turn
        elif frame.reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS) or (
            frame.reason is FinishReason.CANCELLED and self._started(frame.id)
        ):
            self.turns = None  # kept, yet not numbered: a server older than ``rewind``
        self._to_reply(frame)

    def _started(self, id: str) -> bool:
        reply = self.replies.get(id)
        return reply is not None and reply.start is not None

    def _on_reset_ok(self, frame: ResetOk) -> None:
        self.turns = 0
        self._on_in_order(frame)

    def _on_rewound(self, frame: Rewound) -> None:
        self.turns = frame.turns
        self._on_in_order(frame)

    def _feed(self, reply: Reply, frame: ServerFrame) -> None:
        if reply.feed(frame):
            del self.replies[reply.id]

    def _on_error(self, frame: Error) -> None:
        reply = self.replies.get(frame.id) if frame.id is not None else None
        if reply is not None:
            self._feed(reply, frame)
            return
        waiter = self._by_id.pop(frame.id, None) if frame.id is not None else None
        if waiter is None and frame.id is None and self._in_order:
            waiter = self._in_order.popleft()
        error = error_from_frame(frame)
        if waiter is not None:
            waiter.fail(error)
        else:
            log.warning("unclaimed error from the server: %s", error)
            self.unclaimed_error = error
            self.unrouted.append(frame)

    def _on_image_ok(self, frame: ImageOk) -> None:
        waiter = self._by_id.pop(frame.id, None)
        if waiter is None:
            self.unrouted.append(frame)
        else:
            waiter.resolve(frame)

    def _on_in_order(self, frame: ServerFrame) -> None:
        # configured, reset_ok, rewound and pong carry no id: each answers one request, in
        # sending order.
        for waiter in self._in_order:
            if waiter.expects is type(frame):
                break
        else:
            self.unrouted.append(frame)
            return
        if waiter is not self._in_order[0]:
            log.warning("server answered %s out of order", type(frame).__name__)
        self._in_order.remove(waiter)
        waiter.resolve(frame)

    def _on_goaway_frame(self, frame: GoAway) -> None:
        self.goaway = frame
        log.info("server going away in %d ms", frame.in_ms)
        if self._on_goaway is not None:
            self._on_goaway(frame)

    # -- the end -------------------------------------------------------------------------------

    def close(self, error: ConnectionClosedError) -> None:
        """The connection is gone: every reply and request still waiting ends with ``error``."""
        if self.closed is None:
            self.closed = error
        self.fail_all(error)

    def fail_all(self, error: ClientError) -> None:
        for reply in self.replies.values():
            reply.fail(error)
        self.replies.clear()
        self.fail_requests(error)

    def fail_requests(self, error: ClientError) -> None:
        """Every request still waiting for its answer ends with ``error`` (replies go on)."""
        for waiter in [*self._by_id.values(), *self._in_order]:
            waiter.fail(error)
        self._by_id.clear()
        self._in_order.clear()

    def resumed(self, resumed: Resumed | None) -> list[Reply]:
        """A dropped connection was resumed (PROTOCOL.md section 10): the reply whose frames
        follow goes on; one the server had and does not resume is lost (its conversation keeps
        it as cancelled); one whose prompt never reached it is returned, to be sent again (its
        id is unused). Replies whose prompt is still to be sent are not touched."""
        self.turns = resumed.turns if resumed else None
        self.goaway = None  # said by the server left behind
        coming = resumed.reply if resumed else None
        kept = resumed.last_prompt if resumed else None
        again: list[Reply] = []
        for reply in [r for r in self.replies.values() if r.sent and r.id != coming]:
            if reply.id != kept and reply.prompt_frame is not None:
                reply.sent = False
                again.append(reply)
                continue
            reply.fail(ReplyLostError(reply.id, kept=reply.id == kept))
            del self.replies[reply.id]
        return again

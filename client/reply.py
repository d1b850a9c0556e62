"""One generation as the client sees it: an async iterator of text pieces.

The connection's reader feeds every frame carrying the generation's ``id`` into ``Reply.feed``,
which updates the public state at once (``queued``, ``start``, ``tokens``, ``done``) whether or
not anyone iterates; iteration only drains the pieces, so nothing is held beyond the reply itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Self

from wschat.protocol import Done, Error, FinishReason, Queued, ServerFrame, Start, Token, ToolCall

from .errors import ClientError, InternalError, error_from_frame

_END = object()


class Reply:
    """A streaming reply: ``async for piece in reply`` yields text pieces (``str``).

    When the iteration ends, ``done`` holds the ``done`` frame and ``text`` the whole reply. An
    ``error`` frame for the prompt raises its typed ``ChatError`` from the iterator (after the
    ``done`` that follows it for an accepted prompt); a closed connection raises
    ``ConnectionClosedError``. Used as ``async with``, a reply still running at exit is cancelled.
    ``timeout`` bounds each wait for the next piece (None: no bound).
    """

    def __init__(
        self,
        id: str,
        *,
        send_cancel: Callable[[str], None],
        timeout: float | None = None,
    ) -> None:
        self.id = id
        self.timeout = timeout
        self.queued: Queued | None = None
        self.start: Start | None = None
        self.tokens: list[Token] = []
        # the tool calls it makes, in order (a resume's catch-up sends them again: kept once)
        self.calls: list[ToolCall] = []
        self.done: Done | None = None
        self.error: ClientError | None = None
        self._send_cancel = send_cancel
        self.sent = False  # its prompt was handed to a connection (maybe lost with it)
        # the encoded prompt, until the server took it: sent again should a drop lose it
        self.prompt_frame: bytes | None = None
        self._pieces: asyncio.Queue[object] = asyncio.Queue()
        self._finished = asyncio.Event()
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            Token: self._on_token,
            ToolCall: self._on_tool_call,
            Start: self._on_start,
            Queued: self._on_queued,
            Done: self._on_done,
            Error: self._on_error,
        }

    def __repr__(self) -> str:
        state = self.done.reason.value if self.done else ("running" if self.start else "waiting")
        return f"<Reply {self.id} {state} {len(self.tokens)} tokens>"

    # -- state ---------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True once ``done`` arrived, or the prompt was refused, or the connection closed."""
        return self._finished.is_set()

    @property
    def accepted(self) -> bool:
        """The server took the prompt (queued or started): a ``done`` will follow."""
        return self.start is not None or self.queued is not None

    @property
    def position(self) -> int | None:
        """The latest place in the server's queue (1 = next), None once started or never queued."""
        return None if self.start is not None or self.queued is None else self.queued.position

    @property
    def last_index(self) -> int:
        """The ``index`` of the last ``token`` frame received (0: none): a resume's ``last``."""
        return self.tokens[-1].index if self.tokens else 0

    @property
    def turn(self) -> int | None:
        """The exchange this reply is in the conversation (1 = the first), once done and kept;
        None before, or when it was not kept (it failed, or was cancelled while queued)."""
        return self.done.turn if self.done is not None else None

    @property
    def text(self) -> str:
        """The whole reply so far (``done.text`` once done)."""
        if self.done is not None:
            return self.done.text
        return "".join(token.text for token in self.tokens)

    def _failure(self) -> ClientError | None:
        """What iteration raises at the end: an error unless the generation ended normally."""
        if self.done is None:
            return self.error
        if self.done.reason is FinishReason.ERROR:
            return self.error or InternalError("the generation failed", id=self.id)
        return None

    # -- fed by the connection -----------------------------------------------------------------

    def feed(self, frame: ServerFrame) -> bool:
        """Take one frame of this generation; True when the reply is finished."""
        if not self.finished:
            handler = self._handlers.get(type(frame))
            if handler is not None:
                handler(frame)
        return self.finished

    def _on_token(self, frame: Token) -> None:
        if self.tokens and frame.index <= self.tokens[-1].index:
            return  # PROTOCOL.md section 10: never sent twice; if it were, shown once
        self.tokens.append(frame)
        if frame.text:
            self._pieces.put_nowait(frame.text)

    def _on_tool_call(self, frame: ToolCall) -> None:
        if all(call.call_id != frame.call_id for call in self.calls):
            self.calls.append(frame)
            self._pieces.put_nowait(frame)

    def _on_start(self, frame: Start) -> None:
        self.start = frame
        self.prompt_frame = None

    def _on_queued(self, frame: Queued) -> None:
        self.queued = frame
        self.prompt_frame = None

    def _on_done(self, frame: Done) -> None:
        self.done = frame
        self._finish()

    def _on_error(self, frame: Error) -> None:
        self.error = error_from_frame(frame)
        # PROTOCOL.md: a refused prompt gets no ``done``; an accepted one always gets its ``done``
        if not self.accepted:
            self._finish()

    def fail(self, error: ClientError) -> None:
        """End the reply with ``error`` (the connection closed, or the prompt never left)."""
        if not self.finished:
            self.error = error
            self._finish()

    def _finish(self) -> None:
        self.prompt_frame = None
        self._finished.set()
        self._pieces.put_nowait(_END)

    # -- consuming -----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        while not isinstance(item := await self._next(), str):
            pass  # a tool call: ``events`` yields those
        return item

    async def events(self) -> AsyncIterator[str | ToolCall]:
        """Its text pieces and its tool calls, in the order they came."""
        while True:
            try:
                yield await self._next()
            except StopAsyncIteration:
                return

    async def _next(self) -> str | ToolCall:
        async with asyncio.timeout(self.timeout):
            item = await self._pieces.get()
        if item is _END:
            self._pieces.put_nowait(_END)  # iterating again ends at once
            failure = self._failure()
            if failure is not None:
                raise failure
            raise StopAsyncIteration
        assert isinstance(item, str | ToolCall)
        return item

    async def wait(self, timeout: float | None = None) -> Done:
        """Wait for the end without consuming pieces; the ``done`` frame, or the error raised."""
        async with asyncio.timeout(timeout):
            await self._finished.wait()
        failure = self._failure()
        if failure is not None:
            raise failure
        assert self.done is not None
        return self.done

    async def collect(self, timeout: float | None = None) -> str:
        """The whole reply text, once done (``timeout`` bounds the whole wait)."""
        await self.wait(timeout)
        return self.text

    def cancel(self) -> None:
        """Ask the server to stop this generation (no-op once finished).

        Its ``done`` with reason ``cancelled`` still comes and ends the iteration normally.
        """
        if not self.finished:
            self._send_cancel(self.id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.finished:
            self.cancel()
            try:
                async with asyncio.timeout(self.timeout or 30.0):
                    await self._finished.wait()
            except TimeoutError:
                pass

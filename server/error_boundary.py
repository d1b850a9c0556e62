"""Where an exception becomes an ``error`` frame, and the one path every frame of a chat
connection leaves by, which counts each ``error`` by code (``/v1/stats`` errors,
``wschat_errors_total``).

A ``ProtocolError`` or an engine's ``EngineFailure`` keeps its code and message (PROTOCOL.md
"Errors"); anything else is a bug of ours, sent as ``internal`` with a generic message (the
details go to the log, never to the peer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from wschat.protocol import Error, ErrorCode, Frame, ProtocolError

from .engine.failures import EngineFailure

Send = Callable[[Frame], Awaitable[None]]

GENERIC_MESSAGE = "internal error"


def error_frame(error: BaseException, frame_id: str | None = None) -> Error:
    """The ``error`` frame for ``error``: its id is the one the error names, else ``frame_id``
    (the client frame that caused it)."""
    if isinstance(error, ProtocolError):
        return Error(error.code, error.message, error.id or frame_id)
    if isinstance(error, EngineFailure):  # an engine's refusal, worded for clients
        return Error(error.code, error.message, frame_id)
    return Error(ErrorCode.INTERNAL, GENERIC_MESSAGE, frame_id)


class Outbox:
    """Every frame a session sends goes through here to its connection's ``send``; ``error``
    frames are counted on the way, whoever sends them (a handler, a generation, a flood)."""

    def __init__(self, send: Send, count_error: Callable[[ErrorCode], None]) -> None:
        self._send = send
        self._count_error = count_error

    async def __call__(self, frame: Frame) -> None:
        if isinstance(frame, Error):
            self._count_error(frame.code)
        await self._send(frame)

    async def error(self, error: BaseException, frame_id: str | None = None) -> None:
        await self(error_frame(error, frame_id))

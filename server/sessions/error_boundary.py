"""Where an exception becomes an ``error`` frame, and the one path every frame of a chat
connection leaves by, which counts each ``error`` by code (``/v1/stats`` errors,
``wschat_errors_total``).

A ``ProtocolError`` keeps its code and message (PROTOCOL.md "Errors"); an engine's refusal
(``EngineError``, engine/errors.py) or failure worded for clients (``EngineFailure``) gets the
code the table below gives it; anything else is a bug of ours, sent as ``internal`` with a
generic message (the details go to the log, never to the peer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from wschat.protocol import (
    ContextOverflow,
    Error,
    ErrorCode,
    Frame,
    Internal,
    ProtocolError,
    TooLarge,
    Unsupported,
)

from .. import engine
from ..engine.failures import EngineFailure

Send = Callable[[Frame], Awaitable[None]]

GENERIC_MESSAGE = "internal error"


# What each refusal of an engine's is on the wire.
ENGINE_REFUSALS: tuple[tuple[type[engine.EngineError], type[ProtocolError]], ...] = (
    (engine.ImagesUnsupported, Unsupported),
    (engine.TooLarge, TooLarge),
    (engine.ContextOverflow, ContextOverflow),
)


def refused(error: engine.EngineError, frame_id: str | None = None) -> ProtocolError:
    wire = next((w for kind, w in ENGINE_REFUSALS if isinstance(error, kind)), Internal)
    return wire(str(error), id=frame_id)


def expected(error: BaseException) -> bool:
    """A failure the peer is told about as it is (not a bug of ours, which goes to the log)."""
    return isinstance(error, ProtocolError | engine.EngineError | EngineFailure)


def error_frame(error: BaseException, frame_id: str | None = None) -> Error:
    """The ``error`` frame for ``error``: its id is the one the error names, else ``frame_id``
    (the client frame that caused it)."""
    if isinstance(error, engine.EngineError):
        error = refused(error, frame_id)
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

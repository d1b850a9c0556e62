"""Where an exception becomes an ``error`` frame, and the one path every frame of a chat
connection leaves by, which counts each ``error`` by code (``/v1/stats`` errors,
``wschat_errors_total``).

A ``ProtocolError`` keeps its code and message (PROTOCOL.md "Errors"); an engine's error
(engine/errors.py: a refusal before generating, or a failure that ended a generation) keeps its
message, worded for the peer, and gets the code ``ENGINE_ERRORS`` gives its class (its ``detail``
is logged, never sent); anything else is a bug of ours, sent as ``internal`` with a generic
message (the details go to the log, never to the peer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from wschat.protocol import (
    ContextOverflow,
    Error,
    ErrorCode,
    Frame,
    Internal,
    InvalidParams,
    Overloaded,
    ProtocolError,
    TooLarge,
    Unsupported,
)

from .. import engine

Send = Callable[[Frame], Awaitable[None]]

GENERIC_MESSAGE = "internal error"


# What each of an engine's errors is on the wire: the engine itself knows no wire codes.
ENGINE_ERRORS: tuple[tuple[type[engine.EngineError], type[ProtocolError]], ...] = (
    (engine.ImagesUnsupported, Unsupported),
    (engine.PromptTooLong, TooLarge),
    (engine.ConversationTooLong, ContextOverflow),
    (engine.SchemaRefused, InvalidParams),
    (engine.FeatureUnsupported, Unsupported),
    (engine.EngineOverloaded, Overloaded),
    (engine.ContextExhausted, ContextOverflow),
    (engine.EngineFailed, Internal),
    (engine.CallArgumentsInvalid, Internal),
)


def _wire_error(error: engine.EngineError, frame_id: str | None = None) -> ProtocolError:
    """The wire error for an engine's: its message (never its detail) under its class's code."""
    wire = next((w for kind, w in ENGINE_ERRORS if isinstance(error, kind)), None)
    if wire is None:  # a class missing from the table: ours to fix, so nothing of it is shown
        return Internal(GENERIC_MESSAGE, id=frame_id)
    return wire(error.message, id=frame_id)


def expected(error: BaseException) -> bool:
    """A failure the peer is told about as it is (not a bug of ours, which goes to the log)."""
    return isinstance(error, ProtocolError | engine.EngineError)


def error_frame(error: BaseException, frame_id: str | None = None) -> Error:
    """The ``error`` frame for ``error``: its id is the one the error names, else ``frame_id``
    (the client frame that caused it)."""
    if isinstance(error, engine.EngineError):
        error = _wire_error(error, frame_id)
    if isinstance(error, ProtocolError):
        return Error(error.code, error.message, error.id or frame_id)
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

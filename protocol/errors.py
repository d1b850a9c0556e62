"""Every failure the server answers with an ``error`` frame: one class per wire code.

    ProtocolError                  has a stable ``code``; the session goes on (PROTOCOL.md "Errors")
    ├── the peer's fault: what it sent breaks a rule, and sending it again fails again
    │   ├── BadFrame               bad_frame: not msgpack, not a map, wrong type/id/text
    │   ├── InvalidParams          invalid_params: a field's value is wrong, an id is reused
    │   ├── TooLarge               too_large: over a size limit
    │   ├── BadImage               bad_image: not an image the server decodes
    │   ├── Unsupported            unsupported: the model cannot do it (images)
    │   ├── ContextOverflow        context_overflow: the conversation would not fit the context
    │   ├── Busy                   busy: a generation runs or waits in this session
    │   └── NotRunning             not_running: cancel of an id this session never had
    ├── capacity: the same frame may succeed later
    │   └── Overloaded             overloaded: the queue is full, the engine busy or out of
    │                              memory, or the server is shutting down
    └── ours: the server failed the peer
        └── Internal               internal: a generation failed or stalled (generic message)

    SessionMisuse                  not a ProtocolError: our own code broke a rule of ours (an
                                   illegal state change); the peer sees a generic ``internal``

``ProtocolError`` itself has no code, so every failure names its class; a bug raises whatever
it raises (or ``SessionMisuse``) and is never mistaken for the peer's fault.
"""

from __future__ import annotations

from typing import ClassVar

from .constants import ErrorCode


class ProtocolError(Exception):
    """A failure with a stable wire code; ``id`` names the client frame that caused it."""

    code: ClassVar[ErrorCode]

    def __init__(self, message: str, *, id: str | None = None) -> None:
        if not hasattr(type(self), "code"):
            raise TypeError("raise a subclass of ProtocolError: its class names the code")
        super().__init__(message)
        self.message = message
        self.id = id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, message={self.message!r})"


# -- the peer's fault ---------------------------------------------------------------------


class BadFrame(ProtocolError):
    code = ErrorCode.BAD_FRAME


class InvalidParams(ProtocolError):
    code = ErrorCode.INVALID_PARAMS


class TooLarge(ProtocolError):
    code = ErrorCode.TOO_LARGE


class BadImage(ProtocolError):
    code = ErrorCode.BAD_IMAGE


class Unsupported(ProtocolError):
    code = ErrorCode.UNSUPPORTED


class ContextOverflow(ProtocolError):
    code = ErrorCode.CONTEXT_OVERFLOW


class Busy(ProtocolError):
    code = ErrorCode.BUSY


class NotRunning(ProtocolError):
    code = ErrorCode.NOT_RUNNING


# -- capacity -----------------------------------------------------------------------------


class Overloaded(ProtocolError):
    code = ErrorCode.OVERLOADED


# -- ours ---------------------------------------------------------------------------------


class Internal(ProtocolError):
    """The server failed a request; the message is generic (details go to the log only)."""

    code = ErrorCode.INTERNAL


class SessionMisuse(Exception):
    """Our own code broke a rule of ours (an illegal state change): a bug, never the peer's."""

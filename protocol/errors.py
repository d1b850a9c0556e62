"""The one exception type of the protocol layer.

    ProtocolError(code)            a frame broke the wire contract; the session goes on
    ├── BadFrame                   code bad_frame: not msgpack, not a map, wrong type/id/text
    ├── InvalidParams              code invalid_params: a field's value is wrong
    └── FrameTooLarge              code too_large: over a size limit

Server-side failures (busy, overloaded, ...) reuse ``ProtocolError`` with their own code, so one
handler turns every known failure into an ``error`` frame (PROTOCOL.md "Errors").
"""

from __future__ import annotations

from .constants import ErrorCode


class ProtocolError(Exception):
    """A failure with a stable wire code; ``id`` names the client frame that caused it."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, id: str | None = None, code: ErrorCode | None = None):
        super().__init__(message)
        self.message = message
        self.id = id
        if code is not None:
            self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, message={self.message!r})"


class BadFrame(ProtocolError):
    code = ErrorCode.BAD_FRAME


class InvalidParams(ProtocolError):
    code = ErrorCode.INVALID_PARAMS


class FrameTooLarge(ProtocolError):
    code = ErrorCode.TOO_LARGE

"""Exceptions of the wschat client.

    ClientError                      anything this client raises on purpose
    ├── ChatError(code, message)     the server answered with an ``error`` frame
    │   ├── BadFrameError            bad_frame
    │   ├── InvalidParamsError       invalid_params (also raised locally for bad ``params``)
    │   ├── BusyError                busy
    │   ├── NotRunningError          not_running
    │   ├── TooLargeError            too_large (also raised locally, before sending)
    │   ├── BadImageError            bad_image
    │   ├── UnsupportedError         unsupported
    │   ├── ContextOverflowError     context_overflow
    │   ├── OverloadedError          overloaded
    │   └── InternalError            internal
    ├── ConnectionClosedError        the WebSocket closed (close code and reason)
    │   └── ReplyLostError           it dropped, the session resumed, but not this reply
    └── ConnectError                 the connection could not be opened (refused, HTTP 401/403...)
        ├── NoChatEndpointError      HTTP 404: the URL's path is not the chat endpoint
        └── NotServingYetError       the server is starting: worth waiting for (``load_wait``)
            ├── NotListeningError    nothing listens yet, or the handshake was dropped
            └── ModelLoadingError    closed 1013 because the server's model is still loading

The error codes are the protocol's (``wschat.protocol.errors``, which says what each means): a
``ChatError`` is a ``ProtocolError``, and each of its classes is the protocol's class of its code
too (a ``BusyError`` is a ``wschat.protocol.Busy``, and takes its code from it).

Waits that run out raise the built-in ``TimeoutError`` (an opening that runs out of time
raises ``ConnectError``).
"""

from __future__ import annotations

from typing import ClassVar

from wschat.protocol import (
    BadFrame,
    BadImage,
    Busy,
    ContextOverflow,
    Error,
    ErrorCode,
    Internal,
    InvalidParams,
    NotRunning,
    Overloaded,
    ProtocolError,
    TooLarge,
    Unsupported,
)


class ClientError(Exception):
    """Base of every exception this client raises on purpose."""


class ChatError(ClientError, ProtocolError):
    """An ``error`` frame from the server; ``id`` is the client frame it answers, if any."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(
        self, message: str, *, code: ErrorCode | None = None, id: str | None = None
    ) -> None:
        super().__init__(message, id=id)
        if code is not None:
            self.code = code  # type: ignore[misc]  # this one error's, not its class's

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


# the protocol's class first: its ``code`` is the one looked up
class BadFrameError(BadFrame, ChatError):
    pass


class InvalidParamsError(InvalidParams, ChatError):
    pass


class BusyError(Busy, ChatError):
    pass


class NotRunningError(NotRunning, ChatError):
    pass


class TooLargeError(TooLarge, ChatError):
    pass


class BadImageError(BadImage, ChatError):
    pass


class UnsupportedError(Unsupported, ChatError):
    pass


class ContextOverflowError(ContextOverflow, ChatError):
    pass


class OverloadedError(Overloaded, ChatError):
    pass


class InternalError(Internal, ChatError):
    pass


ERRORS: dict[ErrorCode, type[ChatError]] = {cls.code: cls for cls in ChatError.__subclasses__()}
assert set(ERRORS) == set(ErrorCode), "every error code needs its exception class"


def error_from_frame(frame: Error) -> ChatError:
    """The typed exception for an ``error`` frame."""
    return ERRORS[frame.code](frame.message, id=frame.id)


class ConnectionClosedError(ClientError):
    """The WebSocket closed; pending requests and replies end with this.

    ``code`` and ``reason`` are the close frame's (``code`` is 1006 when the connection dropped
    without one); ``error`` is the last ``error`` frame that no request claimed, such as the
    ``overloaded`` sent just before the close 1008 of a frame flood.
    """

    def __init__(
        self, code: int | None, reason: str = "", *, error: ChatError | None = None
    ) -> None:
        self.code = code
        self.reason = reason
        self.error = error
        text = f"connection closed (code {code})" if code is not None else "connection closed"
        if reason:
            text += f": {reason}"
        if error is not None:
            text += f" after error {error}"
        super().__init__(text)


class ReplyLostError(ConnectionClosedError):
    """The connection dropped and the session was resumed, but not this reply's stream
    (PROTOCOL.md section 10). ``kept``: the server had the prompt, and its conversation keeps
    the exchange as cancelled (the reply's ``text`` is what came before the drop); else the
    prompt never reached the server, its id is unused and it can be sent again."""

    def __init__(self, id: str, *, kept: bool) -> None:
        lost = (
            "the rest of the reply was lost (kept as cancelled)" if kept else "the prompt was lost"
        )
        super().__init__(1006, f"dropped mid-reply; the session resumed but {lost}: {id}")
        self.id = id
        self.kept = kept


class ConnectError(ClientError):
    """The connection could not be opened.

    ``status`` is the HTTP status of a refused handshake (401 without valid credentials, 403 for
    a refused origin); ``close_code`` and ``close_reason`` are set when the server accepted and
    then closed before ``ready`` (1013: full, try again later; a loading model raises
    ``ModelLoadingError``).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        close_code: int | None = None,
        close_reason: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.close_code = close_code
        self.close_reason = close_reason


class NoChatEndpointError(ConnectError):
    """HTTP 404: the server answers at this address, but the URL's path is not its chat
    endpoint (``CHAT_PATH``); the message names it."""


class NotServingYetError(ConnectError):
    """The server is not serving chats yet, as while it starts: worth waiting for, unlike a
    refusal or a full server; ``connect``'s ``load_wait`` does the waiting."""


class NotListeningError(NotServingYetError):
    """Nothing accepts connections at the URL yet: the connection was refused, or dropped
    before the handshake's answer, or a proxy in front answered 502, 503 or 504 (its server is
    not up)."""


class ModelLoadingError(NotServingYetError):
    """The server closed with 1013 and ``MODEL_LOADING_REASON``: it is up but still loading its
    model (PROTOCOL.md "Close codes")."""

"""Opening a session: the handshake, credentials, and the ``ready`` frame that must come first.

Every way an opening can fail becomes ``ConnectError`` (PROTOCOL.md "Authentication": a missing
or wrong token is HTTP 401, a refused origin 403; "Close codes": 1013 while the server is full).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol
from wschat.protocol import (
    BEARER_PREFIX,
    SUBPROTOCOL,
    Error,
    GoAway,
    ProtocolError,
    Ready,
    decode_server_frame,
)

from .api import DEFAULT_TIMEOUT, Chat
from .errors import ConnectError

# Server frames are small but for ``done`` (the whole reply); this bounds one incoming message.
DEFAULT_MAX_SIZE = 16 * 1024 * 1024


def session_url(url: str, resume: str | None) -> str:
    """``url`` with ``?resume=`` set when resuming an earlier session."""
    if resume is None:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "resume"] + [("resume", resume)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def subprotocols(token: str | None) -> list[Subprotocol]:
    offered = [Subprotocol(SUBPROTOCOL)]
    if token:
        offered.append(Subprotocol(BEARER_PREFIX + token))
    return offered


async def open_connection(
    url: str,
    token: str | None,
    resume: str | None,
    timeout: float | None,
    options: Mapping[str, Any],
) -> tuple[ClientConnection, Ready]:
    """The open WebSocket and the server's ``ready``; ``ConnectError`` on any failure."""
    kwargs: dict[str, Any] = {
        "subprotocols": subprotocols(token),
        "open_timeout": timeout,
        "max_size": DEFAULT_MAX_SIZE,
        **options,
    }
    try:
        ws = await ws_connect(session_url(url, resume), **kwargs)
    except InvalidStatus as e:
        status = e.response.status_code
        raise ConnectError(
            f"the server refused the connection: HTTP {status}", status=status
        ) from e
    except InvalidURI as e:
        raise ConnectError(f"not a WebSocket URL: {url!r}") from e
    except InvalidHandshake as e:
        raise ConnectError(f"the WebSocket handshake failed: {e}") from e
    except TimeoutError as e:
        raise ConnectError(f"timed out connecting to {url}") from e
    except OSError as e:
        raise ConnectError(f"cannot connect to {url}: {e.strerror or e}") from e
    try:
        return ws, await _first_frame(ws, url, timeout)
    except BaseException:
        await ws.close()
        raise


async def _first_frame(ws: ClientConnection, url: str, timeout: float | None) -> Ready:
    try:
        async with asyncio.timeout(timeout):
            message = await ws.recv()
    except TimeoutError as e:
        raise ConnectError(f"no ready frame from {url}") from e
    except ConnectionClosed as e:
        code = ws.close_code
        reason = f": {ws.close_reason}" if ws.close_reason else ""
        raise ConnectError(
            f"the server closed the connection (code {code}){reason}", close_code=code
        ) from e
    if isinstance(message, str):
        raise ConnectError("the server sent text, not a wschat frame")
    try:
        frame = decode_server_frame(message)
    except ProtocolError as e:
        raise ConnectError(f"the server's first frame does not decode: {e.message}") from e
    if isinstance(frame, Error):
        raise ConnectError(f"the server refused the session: {frame.code.value}: {frame.message}")
    if not isinstance(frame, Ready):
        raise ConnectError(f"expected ready, the server sent {frame.TYPE.value}")
    return frame


class connect:  # used like a function, as websockets' own ``connect``
    """Open a session: ``async with connect(url) as chat`` or ``chat = await connect(url)``.

    ``token`` authenticates (sent as the ``bearer.TOKEN`` subprotocol); ``resume`` is a
    ``resume_token`` of an earlier connection whose conversation to continue. ``timeout`` bounds
    the opening and each request; ``reply_timeout`` each wait for a reply's next piece. A refused
    or failed opening raises ``ConnectError`` (``status`` holds the HTTP status).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        reply_timeout: float | None = None,
        resume: str | None = None,
        on_goaway: Callable[[GoAway], None] | None = None,
        **websocket_options: Any,
    ) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self.reply_timeout = reply_timeout
        self.resume = resume
        self.on_goaway = on_goaway
        self.websocket_options = websocket_options
        self._chat: Chat | None = None

    async def _open(self) -> Chat:
        ws, ready = await open_connection(
            self.url, self.token, self.resume, self.timeout, self.websocket_options
        )
        return Chat(
            ws,
            ready,
            timeout=self.timeout,
            reply_timeout=self.reply_timeout,
            on_goaway=self.on_goaway,
        )

    def __await__(self) -> Generator[Any, None, Chat]:
        return self._open().__await__()

    async def __aenter__(self) -> Chat:
        self._chat = await self._open()
        return self._chat

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._chat is not None:
            await self._chat.close()

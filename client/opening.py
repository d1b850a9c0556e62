"""Opening a session: the handshake, credentials, and the ``ready`` frame that must come first.

Every way an opening can fail becomes ``ConnectError`` (PROTOCOL.md "Authentication": a missing
or wrong token is HTTP 401, a refused origin 403; "Transport": a path that is not the chat
endpoint 404, ``NoChatEndpointError``; "Close codes": 1013 while the server is full). A server
still starting is ``NotServingYetError``: nothing listening yet (``NotListeningError``), or up
but still loading its model (a close 1013 with ``MODEL_LOADING_REASON``: ``ModelLoadingError``);
``connect(load_wait=...)`` keeps trying until it serves.

A connection that drops (it ends without a close frame from the server: a lost network, a reset)
is opened again to resume its session, the reply in flight included (PROTOCOL.md section 10):
``connect(resume_within=...)`` says for how long it tries. So is one whose server goes away
(``goaway``, close 1001 or 1012): the session resumes on a replica that shares its store.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
from collections.abc import Callable, Generator, Iterator, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
    InvalidURI,
)
from websockets.typing import Subprotocol
from wschat.protocol import (
    BEARER_PREFIX,
    CHAT_PATH,
    MODEL_LOADING_REASON,
    SESSION_PARAM,
    SUBPROTOCOL,
    CloseCode,
    Error,
    GoAway,
    ProtocolError,
    Ready,
    decode_server_frame,
)

from .api import DEFAULT_TIMEOUT, Chat
from .errors import (
    ConnectError,
    ModelLoadingError,
    NoChatEndpointError,
    NotListeningError,
    NotServingYetError,
)

log = logging.getLogger("wschat.client")

# Server frames are small but for ``done`` (the whole reply); this bounds one incoming message.
DEFAULT_MAX_SIZE = 16 * 1024 * 1024
# how long a dropped connection is tried again: the server's default --resume-grace-s, within
# which the reply in flight goes on
DEFAULT_RESUME_WITHIN = 15.0
# HTTP statuses that no later try changes: credentials or origin refused, no such endpoint
_FINAL_STATUSES = frozenset({401, 403, 404})
# a proxy in front of a server that is not up yet: waited for like the server itself
_PROXY_NOT_UP = frozenset({502, 503, 504})
# what a server that is not listening yet, or is still starting to, does to a connection
_NOT_UP_ERRNOS = {
    errno.ECONNREFUSED: "nothing is listening there",
    errno.ECONNRESET: "the server reset the connection during the handshake",
    errno.ECONNABORTED: "the connection was aborted during the handshake",
}


def session_url(
    url: str, resume: str | None, session: str | None = None, last: int | None = None
) -> str:
    """``url`` with ``?resume=`` set when resuming an earlier session, with its ``session`` (the
    key a load balancer routes on) and ``last`` (the last token index of the reply in flight)."""
    if resume is None:
        return url
    parts = urlsplit(url)
    ours = {"resume": resume, SESSION_PARAM: session, "last": None if last is None else str(last)}
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ours]
    query += [(k, v) for k, v in ours.items() if v is not None]
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
    session: str | None = None,
    last: int | None = None,
) -> tuple[ClientConnection, Ready]:
    """The open WebSocket and the server's ``ready``; ``ConnectError`` on any failure."""
    kwargs: dict[str, Any] = {
        "subprotocols": subprotocols(token),
        "open_timeout": timeout,
        "max_size": DEFAULT_MAX_SIZE,
        **options,
    }
    try:
        ws = await ws_connect(session_url(url, resume, session, last), **kwargs)
    except InvalidStatus as e:
        raise _refused(url, e.response.status_code) from e
    except InvalidURI as e:
        raise ConnectError(f"not a WebSocket URL: {url!r}") from e
    except InvalidMessage as e:
        if isinstance(e.__cause__, EOFError | ConnectionError):
            message = "the server closed the connection during the handshake"
            raise NotListeningError(f"cannot connect to {url}: {message}") from e
        raise ConnectError(f"the WebSocket handshake failed: {e}") from e
    except InvalidHandshake as e:
        raise ConnectError(f"the WebSocket handshake failed: {e}") from e
    except TimeoutError as e:
        raise ConnectError(f"timed out connecting to {url}") from e
    except OSError as e:
        raise _not_connected(url, e) from e
    try:
        return ws, await _first_frame(ws, url, timeout)
    except BaseException:
        await ws.close()
        raise


def _refused(url: str, status: int) -> ConnectError:
    if status == 404:
        return NoChatEndpointError(no_chat_endpoint(url), status=status)
    error = NotListeningError if status in _PROXY_NOT_UP else ConnectError
    return error(f"the server refused the connection: HTTP {status}", status=status)


def no_chat_endpoint(url: str) -> str:
    """What a 404 to the handshake means; with the URL to use when ``url`` has no path."""
    message = f"no chat endpoint at {url}; the chat endpoint is {CHAT_PATH}"
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        message += f" (try {urlunsplit(parts._replace(path=CHAT_PATH))})"
    return message


def _not_connected(url: str, error: OSError) -> ConnectError:
    """``NotListeningError`` for a refused or reset connection, else ``ConnectError`` (an
    unknown host name, a TLS failure: waiting changes nothing)."""
    # asyncio joins the failures of a name's several addresses (::1 and 127.0.0.1) into one
    # OSError without an errno: each one's is in its text
    found = [error.errno] if error.errno else re.findall(r"\[Errno (\d+)\]", str(error))
    why = next((_NOT_UP_ERRNOS[int(n)] for n in found if int(n) in _NOT_UP_ERRNOS), None)
    if why is not None:
        return NotListeningError(f"cannot connect to {url}: {why}")
    return ConnectError(f"cannot connect to {url}: {error.strerror or error}")


async def _first_frame(ws: ClientConnection, url: str, timeout: float | None) -> Ready:
    try:
        async with asyncio.timeout(timeout):
            message = await ws.recv()
    except TimeoutError as e:
        raise ConnectError(f"no ready frame from {url}") from e
    except ConnectionClosed as e:
        raise _closed_before_ready(ws.close_code, ws.close_reason or "") from e
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


def _closed_before_ready(code: int | None, reason: str) -> ConnectError:
    message = f"the server closed the connection (code {code})" + (f": {reason}" if reason else "")
    loading = code == CloseCode.TRY_AGAIN_LATER and reason == MODEL_LOADING_REASON
    error = ModelLoadingError if loading else ConnectError
    return error(message, close_code=code, close_reason=reason)


def _waited_out(last: NotServingYetError, seconds: float) -> NotServingYetError:
    if isinstance(last, ModelLoadingError):
        message = f"the model was still loading after waiting {seconds:g} s"
    else:
        message = f"{last.message}, still after waiting {seconds:g} s"
    return type(last)(
        message, status=last.status, close_code=last.close_code, close_reason=last.close_reason
    )


def retry_delays(first_s: float = 0.25, max_s: float = 2.0) -> Iterator[float]:
    """Pauses between tries while the server starts: 0.25 s, 0.5 s, 1 s, then every 2 s, so a
    session opens within about 2 s of the server serving, for the price of a handshake (or a
    refused connection). A dropped connection's tries start from 0.1 s."""
    delay = first_s
    while True:
        yield delay
        delay = min(2 * delay, max_s)


class connect:  # used like a function, as websockets' own ``connect``
    """Open a session: ``async with connect(url) as chat`` or ``chat = await connect(url)``.

    ``token`` authenticates (sent as the ``bearer.TOKEN`` subprotocol); ``resume`` is a
    ``resume_token`` of an earlier connection whose conversation to continue, and ``session``
    that connection's ``session``, which a load balancer routes the resume by. ``timeout`` bounds
    each try at opening and each request; ``reply_timeout`` each wait for a reply's next piece.
    A refused or failed opening raises ``ConnectError`` (``status`` holds the HTTP status).

    While the server starts (nothing listening yet, or its model loading: ``NotServingYetError``)
    ``connect`` tries again (``retry_delays``) for up to ``load_wait`` seconds, calling
    ``on_waiting(error)`` as it starts waiting and again whenever what it waits for changes
    (``NotListeningError``, then ``ModelLoadingError``), and ``on_loading()`` once when it starts
    waiting for the model; past that, or at once with the default ``load_wait=0``, it raises
    that error. A full server, a refusal (HTTP 401, 403, 404), an unknown host name or a TLS
    failure is not waited for: it raises ``ConnectError`` at once.

    A connection that drops is resumed: tried again at once, then after 0.1 s, 0.2 s, 0.4 s...
    (at most 2 s apart) for ``resume_within`` seconds (0: never), naming the session, its resume
    token and the last token index of the reply in flight, which then goes on where it was:
    each piece of it is yielded once. A server going away is left and the session resumed the
    same way: after its ``goaway`` (``on_goaway(frame)`` is called) once the reply running
    there has ended, or on its close 1001 or 1012. ``on_resume(ready)`` is called after each
    resume. See ``Chat`` for what a resume that fails ends with.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        reply_timeout: float | None = None,
        resume: str | None = None,
        session: str | None = None,
        on_goaway: Callable[[GoAway], None] | None = None,
        load_wait: float = 0.0,
        on_loading: Callable[[], None] | None = None,
        on_waiting: Callable[[NotServingYetError], None] | None = None,
        resume_within: float = DEFAULT_RESUME_WITHIN,
        on_resume: Callable[[Ready], None] | None = None,
        **websocket_options: Any,
    ) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self.reply_timeout = reply_timeout
        self.resume = resume
        self.session = session
        self.on_goaway = on_goaway
        self.load_wait = load_wait
        self.on_loading = on_loading
        self.on_waiting = on_waiting
        self.resume_within = resume_within
        self.on_resume = on_resume
        self.websocket_options = websocket_options
        self._chat: Chat | None = None

    async def _open_once_serving(self) -> tuple[ClientConnection, Ready]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.load_wait
        delays = retry_delays()
        waiting_for: type[NotServingYetError] | None = None
        loading_told = False
        while True:
            try:
                return await open_connection(
                    self.url,
                    self.token,
                    self.resume,
                    self.timeout,
                    self.websocket_options,
                    self.session,
                )
            except NotServingYetError as starting:
                left = deadline - loop.time()
                if left <= 0 and waiting_for is None:
                    raise
                if left <= 0:
                    raise _waited_out(starting, self.load_wait) from starting
                if type(starting) is not waiting_for and self.on_waiting is not None:
                    self.on_waiting(starting)
                waiting_for = type(starting)
                loading = isinstance(starting, ModelLoadingError)
                if loading and not loading_told and self.on_loading is not None:
                    self.on_loading()
                loading_told |= loading
                await asyncio.sleep(min(next(delays), left))

    async def _open(self) -> Chat:
        ws, ready = await self._open_once_serving()
        return Chat(
            ws,
            ready,
            timeout=self.timeout,
            reply_timeout=self.reply_timeout,
            on_goaway=self.on_goaway,
            reopen=self._reopen if self.resume_within > 0 else None,
            on_resume=self.on_resume,
        )

    async def _reopen(
        self, dropped: Ready, last: int | None
    ) -> tuple[ClientConnection, Ready] | None:
        """A connection to ``dropped``'s session again, or None once ``resume_within`` is over,
        credentials are refused, or the server no longer has the session (a new one)."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.resume_within
        delays = retry_delays(first_s=0.1)
        delay = 0.0
        while (left := give_up_at - loop.time()) > delay:
            await asyncio.sleep(delay)
            delay = next(delays)
            timeout = min(self.timeout or left, left)
            try:
                ws, ready = await open_connection(
                    self.url,
                    self.token,
                    dropped.resume,
                    timeout,
                    self.websocket_options,
                    dropped.session,
                    last,
                )
            except ConnectError as e:
                if e.status in _FINAL_STATUSES:
                    log.warning("resuming the session failed: %s", e)
                    return None
                log.info("resuming the session: %s; trying again", e)
                continue
            if ready.session == dropped.session:
                return ws, ready
            log.warning("the session could not be resumed: the server started a new one")
            await ws.close()
            return None
        return None

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

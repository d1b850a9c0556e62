"""Who may connect: bearer tokens and the browser ``Origin`` (PROTOCOL.md "Authentication").

A token may come in the ``Authorization`` header, as ``bearer.TOKEN`` in the subprotocol list,
or as ``?token=``. Every candidate is compared with every configured token in constant time, and
all comparisons run whatever the outcome, so timing says nothing about which one matched. The
``Origin`` check stops cross-site WebSocket hijacking: a page on another site cannot ride on a
browser's access to this server. The ``Host`` check stops DNS rebinding when no token is set: a
page whose own name was made to resolve to this server is same-origin with it, but names a Host
that is not one of ours.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import Enum
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket
from wschat.protocol import BEARER_PREFIX, CloseCode

from ..settings import Settings

# Names that always mean this machine: a browser never asks DNS for them (RFC 6761).
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class Refusal(Enum):
    """Why a request is turned away."""

    FOREIGN_HOST = "foreign host"
    FOREIGN_ORIGIN = "foreign origin"
    NO_TOKEN = "no token"
    WRONG_TOKEN = "wrong token"


def offered_tokens(conn: HTTPConnection) -> list[str]:
    """Every token the request carries, from all three places."""
    tokens: list[str] = []
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        tokens.append(value.strip())
    for offered in conn.scope.get("subprotocols", []) or []:
        if offered.startswith(BEARER_PREFIX):
            tokens.append(offered.removeprefix(BEARER_PREFIX))
    tokens.extend(conn.query_params.getlist("token"))
    return [t for t in tokens if t]


def owner_scope(conn: HTTPConnection, tokens: tuple[str, ...]) -> str:
    """Whose cached state a request may share, the API's prefix keys and a conversation's
    opening with a system prompt: its token's, whether something is cached saying something
    about what another client sent. The token is the first offered that is one of ``tokens``
    (an offered token that is none would let one client name owners at will, each with a share
    of its own); a digest, so the token is kept nowhere past the request; "" without tokens
    (every client one owner)."""
    owner = ""
    for candidate in offered_tokens(conn):
        for token in tokens:  # every comparison runs, in constant time, as in token_matches
            if hmac.compare_digest(candidate.encode(), token.encode()) and not owner:
                owner = token
    return hashlib.sha256(owner.encode()).hexdigest() if owner else ""


def token_matches(offered: list[str], configured: tuple[str, ...]) -> bool:
    matched = False
    for candidate in offered:
        for token in configured:
            # compare_digest on bytes: non-ASCII text is fine and still constant-time
            matched |= hmac.compare_digest(candidate.encode(), token.encode())
    return matched


def _origin_key(origin: str) -> str:
    """An Origin as origins are compared: no final slash, case folded."""
    return origin.strip().rstrip("/").lower()


def listed_origin(conn: HTTPConnection, settings: Settings) -> str | None:
    """The request's ``Origin`` as sent, where ``--allowed-origin`` lists it; else None."""
    origin = conn.headers.get("origin")
    if origin is None or not settings.allowed_origins:
        return None
    listed = _origin_key(origin) in {_origin_key(o) for o in settings.allowed_origins}
    return origin.strip() if listed else None


def origin_allowed(conn: HTTPConnection, settings: Settings) -> bool:
    origin = conn.headers.get("origin")
    if origin is None:
        return True  # not a browser: the token (if any) is what guards it
    if settings.allowed_origins:
        return listed_origin(conn, settings) is not None
    origin = _origin_key(origin)
    host = conn.headers.get("host", "").lower()
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host


def host_allowed(conn: HTTPConnection, settings: Settings) -> bool:
    """Whether the request's ``Host`` names this server: checked when no token is set (a token
    is what guards the server then) or when ``--allowed-host`` names some."""
    if settings.tokens and not settings.allowed_hosts:
        return True
    allowed = {_host_name(h) for h in (*settings.allowed_hosts, settings.host)}
    if "*" in allowed:
        return True
    name = _host_name(conn.headers.get("host", ""))
    server = conn.scope.get("server")
    # the address the connection reached (the listen address, or this machine's own when
    # listening on 0.0.0.0): an address, which no rebinding page can have as its name
    reached = _host_name(str(server[0])) if server else None
    return bool(name) and (
        name in LOCAL_HOSTS or name.endswith(".localhost") or name in allowed or name == reached
    )


def _host_name(host: str) -> str:
    """The name in a ``Host`` value: lower case, no port, no brackets, no final dot; "" when it
    does not parse."""
    host = host.strip().lower()
    if host == "*":
        return host
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:
        return ""
    return (name or "").rstrip(".")


def refusal(conn: HTTPConnection, settings: Settings) -> Refusal | None:
    """None when the request may go on; else why not (Host and Origin first: 403 before 401)."""
    if not host_allowed(conn, settings):
        return Refusal.FOREIGN_HOST
    if not origin_allowed(conn, settings):
        return Refusal.FOREIGN_ORIGIN
    if not settings.tokens:
        return None
    offered = offered_tokens(conn)
    if not offered:
        return Refusal.NO_TOKEN
    return None if token_matches(offered, settings.tokens) else Refusal.WRONG_TOKEN


_FORBIDDEN = {
    Refusal.FOREIGN_HOST: "this Host is not served here (--allowed-host)",
    Refusal.FOREIGN_ORIGIN: "this Origin may not connect",
}


def refusal_response(why: Refusal) -> Response:
    if why in _FORBIDDEN:
        return JSONResponse(
            {"ok": False, "error": "forbidden", "message": _FORBIDDEN[why]}, status_code=403
        )
    return JSONResponse(
        {"ok": False, "error": "unauthorized", "token_given": why is Refusal.WRONG_TOKEN},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


async def admit(websocket: WebSocket, settings: Settings) -> bool:
    """True when the handshake may be accepted; else it has been refused (HTTP 401/403, or a
    close 1008 where the server cannot send an HTTP response to a WebSocket request)."""
    why = refusal(websocket, settings)
    if why is None:
        return True
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(refusal_response(why))
    else:
        await websocket.close(CloseCode.POLICY_VIOLATION, why.value)
    return False


def http_refusal(conn: HTTPConnection, settings: Settings) -> Response | None:
    """For plain HTTP routes (``/metrics``, ``/v1/auth``): a response to send, or None."""
    why = refusal(conn, settings)
    return None if why is None else refusal_response(why)

"""The API's requests in the connection caps.

Each request to a route that runs a session holds a place in the caps (``Hub.caps``: its
address's and the server's) from its head to its response's end; past them it is answered 429
``overloaded`` before its body is read. A request is a session as a chat connection is, and its
body may be as large as a chat frame: counted together, one address gets no more by using both
doors, and the memory the caps bound is one figure (README "Security and limits"). A body still
arriving is bounded apart, in time and in number, by the transport (runtime/http_protocol.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from wschat.protocol import Overloaded

from ...sessions import Hub
from .cors import allow_origin
from .errors import ApiError


def in_flight(hub: Hub, route: Route) -> Route:
    """``route``, its requests counted in the connection caps while they run."""
    app = route.app

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "OPTIONS":  # a preflight: no body, no session
            await app(scope, receive, send)
            return
        client = scope["client"][0] if scope.get("client") else "unknown"
        full = hub.caps.acquire(client)
        if full is not None:
            message = f"{full}: an API request counts as a connection until it is answered"
            error = ApiError.of(Overloaded(message))
            if error.wire is not None:
                hub.stats.count_error(error.wire)
            response = error.response()
            allow_origin(response, Request(scope), hub.settings)
            await response(scope, receive, send)
            return
        try:
            await app(scope, receive, send)
        finally:
            hub.caps.release(client)

    route.app = counted
    return route

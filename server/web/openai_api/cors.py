"""CORS for the API's routes: a page served from an ``--allowed-origin`` may call the API.

Only an Origin that ``--allowed-origin`` lists is answered (``access.listed_origin``, compared as
the WebSocket's Origin check compares it); without the option the routes send no CORS header, and
a page of this server's own origin needs none. A preflight is answered before the token check (a
browser never sends the token on one) and runs nothing. No ``Access-Control-Allow-Credentials``:
the API's token goes in a header, never in a cookie.
"""

from __future__ import annotations

import re

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...settings import Settings
from ..access import Refusal, host_allowed, listed_origin
from .errors import Endpoint, invalid, refusal_error

# How long a browser may reuse a preflight's answer before it asks again.
MAX_AGE_S = 600
# The header names a preflight may ask for: the OpenAI SDKs ask for about a dozen.
MAX_ASKED_HEADERS = 64
# A 429's retry hint, which a page could not read otherwise.
EXPOSED = "Retry-After"
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


def cors_route(
    path: str, endpoint: Endpoint, method: str | tuple[str, ...], settings: Settings
) -> Route:
    """``endpoint`` at ``path`` for ``method`` (or each of several), with its preflight answered
    and every response to a listed origin marked as readable by it."""
    methods = (method,) if isinstance(method, str) else method

    async def answer(request: Request) -> Response:
        if request.method == "OPTIONS":
            return preflight(request, methods, settings)
        response = await endpoint(request)
        allow_origin(response, request, settings)
        return response

    return Route(path, answer, methods=[*methods, "OPTIONS"], name=endpoint.__name__)


def allow_origin(response: Response, request: Request, settings: Settings) -> None:
    """Mark ``response`` as readable by the request's Origin, when that Origin is listed."""
    origin = listed_origin(request, settings)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
        response.headers.add_vary_header("Origin")


def preflight(request: Request, methods: tuple[str, ...], settings: Settings) -> Response:
    """204 with what the browser asked for, for a listed origin and one of the route's methods;
    403 for another origin (or a foreign Host), without CORS headers, so the browser refuses the
    call."""
    asked = request.headers.get("access-control-request-method")
    if asked is None or "origin" not in request.headers or asked not in methods:
        # not a browser's preflight, or one for a method the route lacks: what that gets today
        raise HTTPException(405, headers={"Allow": ", ".join(methods)})
    if not host_allowed(request, settings):
        return refusal_error(Refusal.FOREIGN_HOST).response()
    origin = listed_origin(request, settings)
    if origin is None:
        return refusal_error(Refusal.FOREIGN_ORIGIN).response()
    names = asked_headers(request.headers.get("access-control-request-headers", ""))
    if names is None:
        message = f"a preflight may ask for at most {MAX_ASKED_HEADERS} well-formed header names"
        return invalid(message, "Access-Control-Request-Headers").response()
    headers = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": asked,
        "Access-Control-Max-Age": str(MAX_AGE_S),
        "Vary": "Origin",
    }
    if names:
        headers["Access-Control-Allow-Headers"] = ", ".join(names)
    return Response(status_code=204, headers=headers)


def asked_headers(value: str) -> list[str] | None:
    """The names in ``Access-Control-Request-Headers``; None when there are too many or one is
    not a header name."""
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    if len(names) > MAX_ASKED_HEADERS or not all(_HEADER_NAME.fullmatch(n) for n in names):
        return None
    return names

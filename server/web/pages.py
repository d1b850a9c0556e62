"""Routes for browsers and dashboards: the chat page, the dashboard, their static files,
``/metrics``, ``/v1/auth`` and the WebSocket ``/v1/stats``.

Everything the pages need ships in the package (``server/web/static/``, the libraries it uses in
``static/vendor/``): no CDN, no build step. The stats socket and ``/metrics`` follow the
same token and Origin rules as the chat socket (PROTOCOL.md "Authentication").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from ..sessions import Hub
from .access import http_refusal
from .admission import Accept, serve_admitted
from .metrics import CONTENT_TYPE, Metrics
from .stats_feed import StatsFeed

STATIC_DIR = Path(__file__).with_name("static")

# The pages load only their own files and talk only to their own origin.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' blob: data:; connect-src 'self';"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def web_routes(hub: Hub, stats_feed: StatsFeed) -> list[BaseRoute]:
    metrics = Metrics(hub)

    async def metrics_page(request: Request) -> Response:
        if (refused := http_refusal(request, hub.settings)) is not None:
            return refused
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def auth_check(request: Request) -> Response:
        """Lets a page tell a refused token from a server that is down (a browser sees neither
        the status nor the reason of a refused WebSocket handshake)."""
        if (refused := http_refusal(request, hub.settings)) is not None:
            return refused
        return JSONResponse({"ok": True, "tokens": bool(hub.settings.tokens)})

    async def stats_socket(websocket: WebSocket) -> None:
        # a stats socket is a connection like a chat: the same caps count it
        async def serve(accept: Accept) -> None:
            await accept(())
            await stats_feed.serve(websocket)

        await serve_admitted(websocket, hub, serve, needs_engine=False)

    return [
        Route("/", _page("index.html")),
        Route("/dashboard", _page("dashboard.html")),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
        Route("/metrics", metrics_page),
        Route("/v1/auth", auth_check),
        WebSocketRoute("/v1/stats", stats_socket),
    ]


def _page(name: str) -> Callable[[Request], Awaitable[Response]]:
    path = STATIC_DIR / name

    async def page(request: Request) -> Response:
        return FileResponse(path, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    return page

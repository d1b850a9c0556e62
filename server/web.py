"""Routes for browsers and dashboards: the chat page, the dashboard, their static files,
``/metrics``, ``/v1/auth`` and the WebSocket ``/v1/stats``.

Everything the pages need ships in the package (``server/static/`` and the protocol's own
``protocol/msgpack.mjs``): no CDN, no build step. The stats socket and ``/metrics`` follow the
same token and Origin rules as the chat socket (PROTOCOL.md "Authentication").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import wschat.protocol
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect
from wschat.protocol import SUBPROTOCOL, CloseCode, encode

from .access import admit, http_refusal
from .hub import Hub
from .live import snapshot
from .metrics import CONTENT_TYPE, Metrics

STATIC_DIR = Path(__file__).with_name("static")
MSGPACK_MODULE = Path(wschat.protocol.__file__).with_name("msgpack.mjs")
STATS_INTERVAL_S = 1.0

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


def web_routes(hub: Hub) -> list[BaseRoute]:
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
        if not await admit(websocket, hub.settings):
            return
        offered = websocket.scope.get("subprotocols", [])
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        await _stream_stats(websocket, hub)

    return [
        Route("/", _page("index.html")),
        Route("/dashboard", _page("dashboard.html")),
        Route("/static/msgpack.mjs", _msgpack_module),
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


async def _msgpack_module(request: Request) -> Response:
    return FileResponse(MSGPACK_MODULE, media_type="text/javascript; charset=utf-8")


async def _stream_stats(websocket: WebSocket, hub: Hub) -> None:
    """One ``stats`` frame at once, then one a second until the peer leaves or we shut down."""
    gone = asyncio.Event()  # set by the reader when the peer disconnects

    async def read_until_gone() -> None:
        try:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass  # the stats socket reads nothing; it only notices the peer leaving
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            gone.set()

    reader = asyncio.create_task(read_until_gone())
    try:
        while not gone.is_set():
            if hub.shutting_down:
                await websocket.close(CloseCode.GOING_AWAY, "server shutting down")
                break
            await websocket.send_bytes(encode(snapshot(hub)))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STATS_INTERVAL_S):
                    await gone.wait()
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader

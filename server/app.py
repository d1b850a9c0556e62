"""The Starlette application: ``/v1/chat``, ``/healthz``, ``/readyz``.

The model loads in a worker thread after the server starts listening, so ``/healthz`` answers at
once and ``/readyz`` turns 200 when the engine is ready; a chat connection before then is
accepted and closed with 1013 and the reason ``MODEL_LOADING_REASON`` (a client may wait), as is
one over the connection caps (with another reason); if loading failed, 1011. Tokens and Origin
are checked before anything else (``access``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from wschat.protocol import MODEL_LOADING_REASON, SUBPROTOCOL, CloseCode

from .access import admit
from .connection import Connection
from .engine import Engine
from .hub import Hub
from .settings import Settings
from .web import web_routes

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs is 3.13+

log = logging.getLogger("wschat.app")

EngineFactory = Callable[[], Engine]
MODEL_FAILED_REASON = "the model failed to load (see the server's log)"


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def readyz(request: Request) -> Response:
    hub: Hub = request.app.state.hub
    if hub.engine is None:
        status = "failed" if request.app.state.load_error else "loading"
        return JSONResponse({"ready": False, "status": status}, status_code=503)
    info = hub.engine.info
    return JSONResponse(
        {
            "ready": True,
            "model": info.model,
            "engine": info.name,
            "device": info.device,
            "dtype": info.dtype,
        }
    )


async def chat(websocket: WebSocket) -> None:
    hub: Hub = websocket.app.state.hub
    if not await admit(websocket, hub.settings):
        return
    offered = websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    if hub.engine is None and websocket.app.state.load_error is not None:
        await websocket.close(CloseCode.INTERNAL_ERROR, MODEL_FAILED_REASON)  # waiting is no use
        return
    if hub.engine is None:
        await websocket.close(CloseCode.TRY_AGAIN_LATER, MODEL_LOADING_REASON)
        return
    if hub.shutting_down:
        await websocket.close(CloseCode.GOING_AWAY, "server shutting down")
        return
    client = websocket.client.host if websocket.client else "unknown"
    full = hub.caps.acquire(client)
    if full is not None:
        await websocket.close(CloseCode.TRY_AGAIN_LATER, full)
        return
    try:
        await _serve_session(websocket, hub)
    finally:
        hub.caps.release(client)


async def _serve_session(websocket: WebSocket, hub: Hub) -> None:
    token = websocket.query_params.get("resume")
    session = hub.sessions.claim(token) if token else None
    session = session or hub.new_session()
    resume_token = hub.sessions.add(session)
    connection = Connection(websocket, hub)
    hub.connections.add(connection)
    try:
        await connection.serve(session, resume_token)
    finally:
        hub.connections.discard(connection)
        hub.sessions.detach(session)
        for expired in hub.sessions.expire():
            hub.forget(expired)


def build_app(settings: Settings, engine: Engine | EngineFactory) -> Starlette:
    """``engine`` is ready (tests) or a factory run in a thread at start-up (the CLI)."""
    hub = Hub(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader: asyncio.Task[None] | None = None
        if _is_factory(engine):
            loader = asyncio.create_task(_load(app, hub, engine))
        else:
            hub.set_engine(engine)
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
            if hub.engine is not None:
                await hub.engine.aclose()

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            WebSocketRoute("/v1/chat", chat),
            *web_routes(hub),
        ],
        lifespan=lifespan,
    )
    app.state.hub = hub
    app.state.load_error = None
    return app


def _is_factory(engine: Engine | EngineFactory) -> TypeIs[EngineFactory]:
    # An engine has ``info``; a factory is a callable that makes one.
    return callable(engine) and not hasattr(engine, "info")


async def _load(app: Starlette, hub: Hub, factory: EngineFactory) -> None:
    started = time.perf_counter()
    try:
        hub.set_engine(await asyncio.to_thread(factory))
        seconds = time.perf_counter() - started
        log.info("ready: accepting chats (the model took %.1f s to load)", seconds)
    except Exception as error:
        app.state.load_error = error
        log.exception("loading the model failed")

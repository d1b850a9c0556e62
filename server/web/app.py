"""The Starlette application: ``/v1/chat``, ``/healthz``, ``/readyz``.

The model loads in a worker thread after the server starts listening, so ``/healthz`` answers at
once and ``/readyz`` turns 200 when the engine is ready (503 ``draining`` again once a drain
began); a chat connection before then is accepted and closed with 1013 and the reason
``MODEL_LOADING_REASON`` (a client may wait), as is one over the connection caps (with another
reason). A load that fails turns ``/healthz`` 503 and closes chats with 1011, and ``serve`` exits
1. Tokens and Origin are checked before anything else (``access``). A WebSocket handshake on
any other path is answered HTTP 404 with ``NO_CHAT_HERE``.
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
from wschat.protocol import CHAT_PATH, SESSION_HEADER

from ..engine import Engine, ResponseFormat, SamplingParams
from ..sessions import Hub, TakenOver
from ..settings import GRAMMAR_AT_START, Settings
from .access import owner_scope
from .admission import Accept, serve_admitted
from .connection import Connection
from .openai_api import OpenAIApi
from .pages import web_routes
from .responses import ResponsesApi
from .stats_feed import StatsFeed

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs is 3.13+

log = logging.getLogger("wschat.app")

EngineFactory = Callable[[], Engine]
LOAD_FAILED = "the model failed to load"
NO_CHAT_HERE = f"no chat endpoint at this path; the chat endpoint is {CHAT_PATH}\n"


async def healthz(request: Request) -> Response:
    hub: Hub = request.app.state.hub
    if hub.load_error is not None:  # the process is about to exit 1 (runtime/serve.py)
        return PlainTextResponse(f"failed: {LOAD_FAILED}\n", status_code=503)
    return PlainTextResponse("ok\n")


async def readyz(request: Request) -> Response:
    hub: Hub = request.app.state.hub
    if hub.shutting_down:  # runtime/shutdown.py: out of rotation while its replies finish
        return JSONResponse({"ready": False, "status": "draining"}, status_code=503)
    if hub.engine is None:
        status = "failed" if hub.load_error else "loading"
        return JSONResponse({"ready": False, "status": status}, status_code=503)
    info = hub.engine.info
    if not await hub.engine.reachable():  # an engine over HTTP (engine/openai)
        return JSONResponse(
            {"ready": False, "status": "engine unreachable", "engine": info.name},
            status_code=503,
        )
    answer: dict[str, object] = {"ready": True, "model": info.model, "engine": info.name}
    if info.remote is not None:  # no device or dtype here: the engine's own kind and host
        remote = info.remote
        answer["remote"] = {"kind": remote.kind, "host": remote.host, "model": remote.model}
    else:
        answer |= {"device": info.runs_on, "dtype": info.backend}
    return JSONResponse(answer)


async def chat(websocket: WebSocket) -> None:
    hub: Hub = websocket.app.state.hub

    async def serve(accept: Accept) -> asyncio.Future[None] | None:
        return await _serve_session(websocket, hub, accept)

    await serve_admitted(websocket, hub, serve, needs_engine=True)


async def _serve_session(
    websocket: WebSocket, hub: Hub, accept: Accept
) -> asyncio.Future[None] | None:
    """Serve one chat connection; the session's held reply once it is over, if one goes on."""
    # ?session= (SESSION_PARAM) is the load balancer's routing key: never looked at here, the
    # resume token alone decides which session this is
    token = websocket.query_params.get("resume")
    claim = await hub.sessions.claim(token) if token else None
    if claim is not None and claim.unavailable:
        log.warning("a resume was not possible (%s): a new session", claim.unavailable)
    resumed = claim.session if claim else None
    address = websocket.client.host if websocket.client else "unknown"
    scope = owner_scope(websocket, hub.settings.tokens)
    session = resumed or hub.new_session(address=address, scope=scope)
    # a resumed session is its new connection's: the resume token proved the right to it
    taken_over = TakenOver(address, scope) if resumed is not None else None
    resume_token = await hub.sessions.add(session)
    connection = Connection(websocket, hub, session)
    hub.connections.add(connection)
    try:
        # PROTOCOL.md "Transport": the routing key a load balancer learns from the handshake
        await accept([(SESSION_HEADER.encode(), session.key.encode())])
        last = _token_index(websocket.query_params.get("last"))
        await connection.serve(resume_token, taken_over, last)
    finally:
        hub.connections.discard(connection)
        await hub.end_connection(session)
    return session.held


async def no_chat_here(websocket: WebSocket) -> None:
    """A handshake on a path no WebSocket route serves: HTTP 404 naming the chat endpoint. Left
    to Starlette it is a close before accept, which uvicorn answers 403, and that reads as a
    refused token or Origin."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(PlainTextResponse(NO_CHAT_HERE, status_code=404))
    else:
        await websocket.close()


def _token_index(value: str | None) -> int | None:
    """``?last=``: a token index (PROTOCOL.md section 10); anything else counts as absent."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 12:
        return None
    return int(value)


def build_app(settings: Settings, engine: Engine | EngineFactory) -> Starlette:
    """``engine`` is ready (tests) or a factory run in a thread at start-up (the CLI)."""
    hub = Hub(settings)
    stats_feed = StatsFeed(hub)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader: asyncio.Task[None] | None = None
        if _is_factory(engine):
            loader = asyncio.create_task(_load(app, hub, engine))
        else:
            hub.set_engine(engine)
        sampler = asyncio.create_task(stats_feed.sample_forever())
        try:
            yield
        finally:
            sampler.cancel()
            if loader is not None:
                loader.cancel()
            await hub.aclose()
            if hub.engine is not None:
                await hub.engine.aclose()

    api = OpenAIApi(hub)  # the OpenAI-compatible HTTP API (openai_api/)
    responses = ResponsesApi(hub, api)  # its Responses API, over HTTP and a WebSocket
    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            WebSocketRoute(CHAT_PATH, chat),
            # before the static mount, which would otherwise take the handshake and close it (403)
            WebSocketRoute("/static/{path:path}", no_chat_here),
            *api.routes(),
            *responses.routes(),
            *web_routes(hub, stats_feed),
            api.unknown_paths(),
            WebSocketRoute("/{path:path}", no_chat_here),  # last: what no other route serves
        ],
        lifespan=lifespan,
    )
    app.state.hub = hub
    app.state.stats_feed = stats_feed
    return app


def _is_factory(engine: Engine | EngineFactory) -> TypeIs[EngineFactory]:
    # An engine has ``info``; a factory is a callable that makes one.
    return callable(engine) and not hasattr(engine, "info")


async def _load(app: Starlette, hub: Hub, factory: EngineFactory) -> None:
    started = time.perf_counter()
    try:
        engine = await asyncio.to_thread(factory)
        if hub.settings.grammar_vocabulary == GRAMMAR_AT_START:  # built before any chat
            await engine.prepare_reply(SamplingParams(1, response_format=ResponseFormat()))
        hub.set_engine(engine)
        seconds = time.perf_counter() - started
        log.info("ready: accepting chats (the model took %.1f s to load)", seconds)
    except Exception as error:
        hub.load_error = error
        log.error("%s: %s", LOAD_FAILED, error, exc_info=error)

"""What every WebSocket route does before it serves: the access checks (``access.admit``), the
accept with our subprotocol, a close for what cannot be served now, and a place in the
connection caps, which chat and ``/v1/stats`` sockets share (PROTOCOL.md "Limits"). A chat's
place outlives its connection while its reply goes on for a resume (``Session.held``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from starlette.websockets import WebSocket
from wschat.protocol import MODEL_LOADING_REASON, SUBPROTOCOL, CloseCode

from ..sessions import Hub
from .access import admit

log = logging.getLogger("wschat.admission")

MODEL_FAILED_REASON = "the model failed to load (see the server's log)"
# addresses remembered as told that the model is loading: past this many, no more lines
MAX_TOLD_LOADING = 1024

# Accepts the handshake, with these headers on its response.
Accept = Callable[[Sequence[tuple[bytes, bytes]]], Awaitable[None]]
# Serves an admitted socket; what it returns, while not done, keeps the socket's place.
Serve = Callable[[Accept], Awaitable["asyncio.Future[None] | None"]]


async def serve_admitted(
    websocket: WebSocket,
    hub: Hub,
    serve: Serve,
    *,
    needs_engine: bool,
) -> None:
    """Run ``serve`` for an admitted socket that holds a place in the caps; ``serve`` accepts it
    (so that the handshake's response can say what it looked up first: a chat's session). One
    that cannot be served is accepted and closed with the reason, so that a browser sees it."""
    if not await admit(websocket, hub.settings):
        return

    async def accept(headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        offered = websocket.scope.get("subprotocols", [])
        subprotocol = SUBPROTOCOL if SUBPROTOCOL in offered else None
        await websocket.accept(subprotocol=subprotocol, headers=headers)

    client = websocket.client.host if websocket.client else "unknown"
    if (closed := _unservable(hub, needs_engine)) is not None:
        if closed[1] == MODEL_LOADING_REASON:
            _tell_loading(hub, client)
        await accept()
        await websocket.close(*closed)
        return
    full = hub.caps.acquire(client, resuming="resume" in websocket.query_params)
    if full is not None:
        await accept()
        await websocket.close(CloseCode.TRY_AGAIN_LATER, full)
        return
    held: asyncio.Future[None] | None = None
    try:
        held = await serve(accept)
    finally:
        if held is None or held.done():
            hub.caps.release(client)
        else:  # a reply held for a resume counts as a connection of its address until it ends
            hub.caps.hold(client)
            held.add_done_callback(lambda _: hub.caps.release_held(client))


def _tell_loading(hub: Hub, client: str) -> None:
    """One line for each address that waits for the model: a waiting client reconnects every
    2 s, and the connection lines are debug lines (runtime/log_levels.py)."""
    if client in hub.told_loading or len(hub.told_loading) >= MAX_TOLD_LOADING:
        return
    hub.told_loading.add(client)
    log.info("a client at %s waits for the model to load (closed with 1013 until then)", client)


def _unservable(hub: Hub, needs_engine: bool) -> tuple[CloseCode, str] | None:
    """The close code and reason for a socket that cannot be served now, or None."""
    if needs_engine and hub.engine is None:
        if hub.load_error is not None:  # waiting is no use: the server exits (runtime/serve.py)
            return CloseCode.INTERNAL_ERROR, MODEL_FAILED_REASON
        # a client may wait for this reason (PROTOCOL.md "Close codes")
        return CloseCode.TRY_AGAIN_LATER, MODEL_LOADING_REASON
    if hub.shutting_down:
        return CloseCode.GOING_AWAY, "server shutting down"
    return None

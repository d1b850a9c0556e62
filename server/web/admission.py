"""What every WebSocket route does before it serves: the access checks (``access.admit``), the
accept with our subprotocol, a close for what cannot be served now, and a place in the
connection caps, which chat and ``/v1/stats`` sockets share (PROTOCOL.md "Limits")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.websockets import WebSocket
from wschat.protocol import MODEL_LOADING_REASON, SUBPROTOCOL, CloseCode

from ..sessions.hub import Hub
from .access import admit

MODEL_FAILED_REASON = "the model failed to load (see the server's log)"


async def serve_admitted(
    websocket: WebSocket,
    hub: Hub,
    serve: Callable[[], Awaitable[None]],
    *,
    needs_engine: bool,
) -> None:
    """Run ``serve`` for an admitted, accepted socket that holds a place in the caps; close it
    with the reason (after the accept, so that a browser sees it) when it cannot be served."""
    if not await admit(websocket, hub.settings):
        return
    offered = websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    if needs_engine and hub.engine is None:
        if hub.load_error is not None:  # waiting is no use: the server exits (runtime/serve.py)
            await websocket.close(CloseCode.INTERNAL_ERROR, MODEL_FAILED_REASON)
        else:  # a client may wait for this reason (PROTOCOL.md "Close codes")
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
        await serve()
    finally:
        hub.caps.release(client)

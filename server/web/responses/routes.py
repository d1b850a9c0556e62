"""The Responses API over HTTP: ``POST /v1/responses`` (streamed as server-sent events or
answered whole), ``GET`` and ``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``;
and its WebSocket mode at ``/v1/responses`` (socket.py).

The same admission as the chat API's (``OpenAIApi.admit``: tokens, Origin, Host, the model
loaded, no drain), the same connection caps for a create (in_flight.py), the same body reading
(bodies.py) and error shape (errors.py); a create runs as a chat completion does (run.py).
Headers go out at ``start``, so a refusal that comes while queued is still an HTTP error with
its status; one after that ends the stream with ``response.failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket
from wschat.protocol import ProtocolError

from ...engine import EngineError
from ...sessions import RESPONSES_API, Hub
from ..access import owner_scope
from ..openai_api import OpenAIApi
from ..openai_api.bodies import json_body
from ..openai_api.cors import cors_route
from ..openai_api.errors import ApiError, Endpoint, guarded, invalid, unsupported
from ..openai_api.in_flight import in_flight
from ..openai_api.reply import CUT_SHORT
from .request import create_body
from .run import ResponseRun, Responses, not_found
from .shapes import Event, encoded
from .socket import serve_socket

log = logging.getLogger("wschat.responses")

PATH = "/v1/responses"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# how long a cancel waits for the response's end (the engine stops within a decode step; a
# stream whose reader does not read may hold its last events longer)
CANCEL_WAIT_S = 10.0


class ResponsesApi:
    def __init__(self, hub: Hub, api: OpenAIApi) -> None:
        self.hub = hub
        self.api = api  # the chat API's admission, engine keys and remembered replies
        self.responses = Responses(hub, api.replies)

    def routes(self) -> list[BaseRoute]:
        settings = self.hub.settings
        return [
            in_flight(self.hub, cors_route(PATH, guarded(self.create), "POST", settings)),
            cors_route(f"{PATH}/{{id}}", self._answered(self.one), ("GET", "DELETE"), settings),
            cors_route(f"{PATH}/{{id}}/cancel", self._answered(self.cancel), "POST", settings),
            WebSocketRoute(PATH, self.socket),
        ]

    def _answered(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` guarded, its refusal (an ``ApiError``: not found, unauthorized) answered
        as one, not logged as a failure of ours: a client must not fill the log."""

        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except ApiError as e:
                return self.api.refused(e)

        return guarded(answer)

    async def socket(self, websocket: WebSocket) -> None:
        await serve_socket(websocket, self.hub, self.api, self.responses)

    async def create(self, request: Request) -> Response:
        try:
            run, stream = await self._begin(request)
        except (ApiError, ProtocolError, EngineError) as e:
            return self.api.refused(ApiError.of(e))
        except ClientDisconnect:  # gone, or dropped, before its body was whole: nobody reads it
            return Response(status_code=499)
        try:
            return await self._respond(run, stream)
        except BaseException:
            run.reply.cancel()  # a failure of ours (guarded answers it), or the task cancelled
            raise

    async def _begin(self, request: Request) -> tuple[ResponseRun, bool]:
        self.api.admit(request)
        hub = self.hub
        engine = hub.engine
        assert engine is not None
        read = await json_body(request, hub.settings.max_frame_bytes, engine)
        body = create_body(read, hub.settings)
        owner = owner_scope(request, hub.settings.tokens)
        previous_id = body.previous_response_id
        previous = self.responses.previous(previous_id, owner) if previous_id else None
        run = await self.responses.start(
            body,
            previous,
            owner=owner,
            address=request.client.host if request.client else "unknown",
            keys=self.api.keys.of(owner),
            api=RESPONSES_API,
            watch=request,
        )
        return run, body.stream

    async def _respond(self, run: ResponseRun, stream: bool) -> Response:
        first = await run.first()
        if isinstance(first, ApiError):
            return self.api.refused(first)
        if stream:
            events = _server_sent(run.events())
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        async for _ in run.events():
            pass
        shape = run.shape
        if not run.ended:
            return Response(status_code=499)  # the client is gone: nobody reads it
        if shape.status == "cancelled" and self.hub.shutting_down:
            return self.api.refused(CUT_SHORT)
        if shape.status == "failed":
            error = run.error or ApiError("generation failed", status=500, code="internal")
            return self.api.refused(error)
        return JSONResponse(shape.object())

    async def one(self, request: Request) -> Response:
        """``GET``: the response as it stands (running, or kept); ``DELETE``: forget a kept one."""
        self.api.admit(request)
        response_id = request.path_params["id"]
        owner = owner_scope(request, self.hub.settings.tokens)
        running = self.responses.running.get(response_id)
        if running is not None and running.owner != owner:
            running = None
        if request.method == "GET":
            if request.query_params.get("stream") not in (None, "false"):
                raise unsupported("a response's stream is not served again", "stream")
            if running is not None:
                return JSONResponse(running.shape.object())
            kept = self.responses.kept.get(response_id, owner)
            if kept is None:
                raise not_found(response_id)
            return JSONResponse(kept.body)
        if running is not None:
            raise invalid(f"response {response_id!r} has not ended: cancel it first")
        if not self.responses.kept.delete(response_id, owner):
            raise not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: Request) -> Response:
        """A running response cancelled (its stream, if read, ends ``cancelled``), answered
        once it ended; one already cancelled, as it is."""
        self.api.admit(request)
        response_id = request.path_params["id"]
        owner = owner_scope(request, self.hub.settings.tokens)
        running = self.responses.running.get(response_id)
        if running is not None and running.owner == owner:
            running.cancel()
            task = running.reply.session.generation_task
            if task is not None:
                with contextlib.suppress(TimeoutError, Exception):
                    async with asyncio.timeout(CANCEL_WAIT_S):
                        await asyncio.shield(task)
            return JSONResponse(running.shape.object())
        kept = self.responses.kept.get(response_id, owner)
        if kept is None:
            raise not_found(response_id)
        if kept.body["status"] != "cancelled":
            raise invalid(f"response {response_id!r} has already ended ({kept.body['status']})")
        return JSONResponse(kept.body)


async def _server_sent(events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """Each event as OpenAI sends it: its type as the SSE event, its JSON as the data; a failure
    of ours mid-stream an ``error`` event (generic: the traceback goes to the log only)."""
    try:
        async for event in events:
            yield _event(event)
    except Exception as error:
        log.exception("a response's stream failed")
        failed = {"type": "error", **ApiError.of(error).body()["error"]}
        yield _event(Event("error", encoded(failed)))


def _event(event: Event) -> bytes:
    return f"event: {event.kind}\ndata: {event.data}\n\n".encode()

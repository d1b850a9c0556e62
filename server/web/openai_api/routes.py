"""The OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions``, streamed as server-sent events or answered whole.

A request's body is read into the session's input (requests.py, conversation.py: a
``Converse`` or a ``Complete``), and its ``Reply`` (reply.py, the HTTP door) runs it as a session
of its own. Headers go out at ``start``, so a refusal that comes while queued (the queue full, a
fair share) is still an HTTP error with its status; one after that is an ``error`` event in the
stream.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from wschat.protocol import FinishReason, ProtocolError

from ...engine import EngineError
from ...sessions import Complete, Converse, Hub
from ..access import owner_scope, refusal
from .bodies import json_body
from .choices import Choices
from .conversation import ReplyIds, conversation_of, new_prompt_id
from .cors import cors_route
from .errors import ApiError, guarded, refusal_error, unknown_path
from .in_flight import in_flight
from .models import Models
from .prefix_keys import CacheKeys
from .reply import CUT_SHORT, Reply, shutting_down
from .requests import Sampling, chat_body, completion_body

# What the catch-all for unknown paths answers (a route's methods default to GET)
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class OpenAIApi:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.replies = ReplyIds()
        self._keys: CacheKeys | None = None
        self.models = Models(hub, self.admit)

    @property
    def keys(self) -> CacheKeys:
        engine = self.hub.engine
        assert engine is not None
        if self._keys is None:
            self._keys = CacheKeys(engine.forget)
        return self._keys

    def routes(self) -> list[BaseRoute]:
        settings = self.hub.settings
        return [
            cors_route("/v1/models", guarded(self.models.list), "GET", settings),
            cors_route("/v1/models/{model:path}", guarded(self.models.retrieve), "GET", settings),
            in_flight(
                self.hub, cors_route("/v1/chat/completions", guarded(self.chat), "POST", settings)
            ),
            in_flight(
                self.hub,
                cors_route("/v1/completions", guarded(self.completions), "POST", settings),
            ),
        ]

    def unknown_paths(self) -> BaseRoute:
        """Last among the HTTP routes: any other path under /v1/, in OpenAI's shape (404)."""
        return Route("/v1/{path:path}", guarded(unknown_path), methods=ANY_METHOD)

    async def chat(self, request: Request) -> Response:
        return await self._answer(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._answer(request, "completion")

    async def _answer(self, request: Request, kind: str) -> Response:
        try:
            reply, sampling = await self._begin(request, kind)
        except (ApiError, ProtocolError, EngineError) as e:
            return self.refused(ApiError.of(e))
        except ClientDisconnect:  # gone, or dropped, before its body was whole: nobody reads it
            return Response(status_code=499)
        try:
            return await self._respond(reply, sampling)
        except BaseException:
            reply.cancel()  # a failure of ours (cors.py answers it), or the task cancelled
            raise

    async def _begin(self, request: Request, kind: str) -> tuple[Reply | Choices, Sampling]:
        """The request read and its prompt queued, or its refusal raised."""
        self.admit(request)
        engine = self.hub.engine
        assert engine is not None
        body = await json_body(request, self.hub.settings.max_frame_bytes, engine)
        hub = self.hub
        prompt: Converse | Complete
        if kind == "chat":
            parsed = chat_body(body, hub.settings)
            prompt = conversation_of(parsed, self.replies)
            sampling = parsed.sampling
        else:
            completion = completion_body(body, hub.settings, engine.info.context_tokens)
            self._check_ids(completion.ids)
            ids = tuple(completion.ids) if completion.ids is not None else None
            params = completion.sampling.params
            prompt = Complete(new_prompt_id("cmpl"), completion.text, ids, params)
            sampling = completion.sampling
        owner = owner_scope(request, hub.settings.tokens)
        address = request.client.host if request.client else "unknown"
        keys = self.keys.of(owner)

        def make(index: int) -> Reply:
            return Reply(
                hub,
                kind,
                keys,
                address=address,
                owner=owner,
                watch=request,
                replies=self.replies,
                index=index,
            )

        if sampling.n > 1:
            return await Choices.begin(make, prompt, sampling.n), sampling
        reply = make(0)
        try:
            await reply.begin(prompt)
        except BaseException:
            reply.cancel()  # what began of it ends: its slot is given back
            raise
        return reply, sampling

    async def _respond(self, reply: Reply | Choices, sampling: Sampling) -> Response:
        first = await reply.first()
        if isinstance(first, ApiError):
            return self.refused(first)
        if sampling.stream:
            events = reply.events(sampling, first)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        try:
            ended = await reply.whole()
        finally:
            reply.cancel()
        if ended is None:
            return Response(status_code=499)  # nobody reads it
        done, error = ended
        if error is None and done.reason is FinishReason.CANCELLED:
            error = CUT_SHORT
        if error is not None:
            return self.refused(error)
        return JSONResponse(reply.body(done))

    def admit(self, request: Request) -> None:
        """Refused (401, 403, 503), or the request may go on."""
        why = refusal(request, self.hub.settings)
        if why is not None:
            raise refusal_error(why)
        hub = self.hub
        if hub.engine is None:
            message = "the model failed to load" if hub.load_error else "the model is loading"
            raise ApiError(message, status=503, code="overloaded")
        if hub.shutting_down:
            raise shutting_down()

    def _check_ids(self, ids: list[int] | None) -> None:
        engine = self.hub.engine
        assert engine is not None
        limit = engine.info.vocab_size or 1 << 31
        if ids is not None and max(ids) >= limit:
            raise ApiError(
                f"token ids must be below {limit}", param="prompt", code="invalid_params"
            )

    def refused(self, error: ApiError) -> Response:
        if error.wire is not None:
            self.hub.stats.count_error(error.wire)
        return error.response()

"""The OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions``, streamed as server-sent events or answered whole.

Each request becomes a session of its own (conversation.py) whose frames come here through a
``FrameChannel`` instead of a socket: ``queued`` while it waits for a slot (the same slots and
queue as WebSocket prompts), ``start``, ``token``s, then ``done``. Headers go out at ``start``,
so a refusal that comes while queued (the queue full, a fair share) is still an HTTP error with
its status; one after that is an ``error`` event in the stream. A client that goes away cancels
the reply as a WebSocket ``cancel`` does: the engine stops within a decode step and the slot is
free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from wschat.protocol import (
    Done,
    Error,
    FinishReason,
    Frame,
    Overloaded,
    ProtocolError,
    Start,
)
from wschat.protocol import Token as TokenFrame

from ...engine import EngineError
from ...sessions.generation import GenerationRun
from ...sessions.hub import Hub
from ...sessions.inputs import Complete, Converse
from ..access import owner_scope, refusal
from .bodies import json_body
from .conversation import ReplyIds, conversation_of, new_prompt_id
from .cors import cors_route
from .errors import ApiError, guarded, refusal_error, unknown_path
from .in_flight import in_flight
from .models import Models, model_id
from .prefix_keys import CacheKeys
from .requests import Sampling, chat_body, completion_body

log = logging.getLogger("wschat.openai_api")

# What the catch-all for unknown paths answers (a route's methods default to GET)
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}
# A reply cancelled while its client still reads: only a shutdown does that (a client that
# leaves has nobody left to tell)
CUT_SHORT = ApiError.of(Overloaded("the reply was cut short: the server is shutting down"))


class FrameChannel:
    """A session's ``send`` for one HTTP request: each frame waits until the request has taken
    it, so while the client reads slowly the generation merges its tokens, as for a slow socket.
    Once closed (the client is gone) frames are dropped."""

    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._changed = asyncio.Event()
        self.closed = False

    async def __call__(self, frame: Frame) -> None:
        if self.closed:
            return
        self._frames.append(frame)
        self._changed.set()
        while self._frames and not self.closed:
            self._changed.clear()
            await self._changed.wait()

    async def next(self) -> Frame | None:
        """The next frame; None once closed."""
        while not self._frames:
            if self.closed:
                return None
            self._changed.clear()
            await self._changed.wait()
        frame = self._frames.popleft()
        self._changed.set()
        return frame

    def close(self) -> None:
        self.closed = True
        self._frames.clear()
        self._changed.set()


class Reply:
    """One request's run: its session, its frames."""

    def __init__(self, api: OpenAIApi, request: Request, kind: str, owner: str) -> None:
        """``owner``: whose prefixes and openings it may share (``access.owner_scope``)."""
        self.api = api
        self.kind = kind  # "chat" or "completion"
        self.frames = FrameChannel()
        address = request.client.host if request.client else "unknown"
        keys = api.keys.of(owner)  # each run under the key whose state it goes on from
        self.session = api.hub.new_request(
            address=address, scope=owner, outbox=self.frames, keys=keys
        )
        self.run: GenerationRun | None = None
        self.created = int(time.time())
        self._request = request
        self._watch: asyncio.Task[None] | None = None

    async def begin(self, prompt: Converse | Complete) -> None:
        """Queue the prompt as a session does (its refusals raised as they are)."""
        await self.session.handle(prompt)
        run = self.session.run
        assert run is not None  # an accepted prompt has its run until it ends
        self.run = run
        task = self.session.generation_task
        assert task is not None
        task.add_done_callback(lambda _: self._ended())
        self.api.hub.requests.add(self.session)  # in /v1/stats while it runs or waits
        self._watch = asyncio.create_task(self._until_disconnected())

    def _ended(self) -> None:
        """The run is over: a chat's reply remembered as the ids it was generated as."""
        run = self.run
        assert run is not None
        if self._watch is not None:
            self._watch.cancel()
        self.api.hub.requests.discard(self.session)
        finished = run.finished
        if run.kept and finished is not None and self.kind == "chat" and finished.reason in _FINISH:
            self.api.replies.remember(finished.text, finished.completion_ids)

    async def _until_disconnected(self) -> None:
        with contextlib.suppress(Exception):
            while (await self._request.receive())["type"] != "http.disconnect":
                pass
        self.cancel()

    def cancel(self) -> None:
        self.session.cancel_run()
        self.frames.close()

    async def first(self) -> Start | ApiError:
        """``start``, or the error that ended the request before it (the run drained)."""
        while True:
            frame = await self.frames.next()
            if isinstance(frame, Start):
                return frame
            if isinstance(frame, Error):
                await self._drain()
                return ApiError.of_frame(frame)
            if isinstance(frame, Done) and self.api.hub.shutting_down:
                return shutting_down()  # cancelled while queued by the drain
            if frame is None or isinstance(frame, Done):
                # cancelled while queued: the client is gone, nobody reads this
                return ApiError("the request was cancelled", status=499, code="cancelled")

    async def _drain(self) -> None:
        while not isinstance(await self.frames.next(), Done | None):
            pass

    async def whole(self) -> tuple[Done, ApiError | None] | None:
        """The reply's ``done`` and its error, if it failed; None once the client is gone."""
        error: ApiError | None = None
        while True:
            frame = await self.frames.next()
            if frame is None:
                return None  # the client is gone
            if isinstance(frame, Error):
                error = ApiError.of_frame(frame)
            elif isinstance(frame, Done):
                return frame, error

    async def events(self, sampling: Sampling, start: Start) -> AsyncIterator[bytes]:
        """The reply as server-sent events, ``data: [DONE]`` last."""
        try:
            if self.kind == "chat":
                yield self._event(self._chunk({"role": "assistant", "content": ""}, None, sampling))
            while (frame := await self.frames.next()) is not None:
                if isinstance(frame, TokenFrame):
                    yield self._event(self._chunk(self._delta(frame.text), None, sampling))
                elif isinstance(frame, Error):
                    yield self._event(ApiError.of_frame(frame).body())
                elif isinstance(frame, Done):
                    reason = _FINISH.get(frame.reason)
                    if reason is not None:
                        yield self._event(self._chunk(self._delta(""), reason, sampling))
                    elif frame.reason is FinishReason.CANCELLED:
                        yield self._event(CUT_SHORT.body())
                    if sampling.include_usage:
                        yield self._event(self._usage_chunk(frame))
                    yield b"data: [DONE]\n\n"
                    return
        except Exception as error:  # a failure of ours: the client is told, as a socket is
            log.exception("reply %s failed", self.run.id if self.run else "?")
            yield self._event(ApiError.of(error).body())
        finally:
            self.cancel()  # nothing if it ended; else the client went away mid-stream

    def _delta(self, text: str) -> dict[str, Any]:
        return {"content": text} if self.kind == "chat" else {"text": text}

    def _chunk(
        self, delta: dict[str, Any], finish: str | None, sampling: Sampling
    ) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, **delta, "logprobs": None, "finish_reason": finish}
        chunk = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        chunk["choices"] = [choice]
        if sampling.include_usage:
            chunk["usage"] = None
        return chunk

    def _usage_chunk(self, done: Done) -> dict[str, Any]:
        chunk = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        chunk["choices"] = []
        chunk["usage"] = usage(done)
        return chunk

    def body(self, done: Done) -> dict[str, Any]:
        reason = _FINISH.get(done.reason, "stop")
        if self.kind == "chat":
            message = {"role": "assistant", "content": done.text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": reason}
            body = self._head("text_completion")
        body["choices"] = [choice]
        body["usage"] = usage(done)
        return body

    def _head(self, kind: str) -> dict[str, Any]:
        assert self.run is not None
        info = self.session.engine.info
        return {
            "id": self.run.id,
            "object": kind,
            "created": self.created,
            "model": model_id(info),
            "system_fingerprint": info.fingerprint or None,
        }

    @staticmethod
    def _event(data: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def shutting_down() -> ApiError:
    """A request refused, or cancelled while queued, by a drain: as a WebSocket prompt is told,
    worth a retry (on another replica, or once the server is back)."""
    return ApiError("the server is shutting down", status=503, code="overloaded")


def usage(done: Done) -> dict[str, Any]:
    u = done.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


class OpenAIApi:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.replies = ReplyIds()
        self._keys: CacheKeys | None = None
        self.models = Models(hub, self._admit)

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
            return self._refused(ApiError.of(e))
        except ClientDisconnect:  # gone, or dropped, before its body was whole: nobody reads it
            return Response(status_code=499)
        try:
            return await self._respond(reply, sampling)
        except BaseException:
            reply.cancel()  # a failure of ours (cors.py answers it), or the task cancelled
            raise

    async def _begin(self, request: Request, kind: str) -> tuple[Reply, Sampling]:
        """The request read and its prompt queued, or its refusal raised."""
        self._admit(request)
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
        reply = Reply(self, request, kind, owner_scope(request, hub.settings.tokens))
        try:
            await reply.begin(prompt)
        except BaseException:
            reply.cancel()  # what began of it ends: its slot is given back
            raise
        return reply, sampling

    async def _respond(self, reply: Reply, sampling: Sampling) -> Response:
        first = await reply.first()
        if isinstance(first, ApiError):
            return self._refused(first)
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
            return self._refused(error)
        return JSONResponse(reply.body(done))

    def _admit(self, request: Request) -> None:
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

    def _refused(self, error: ApiError) -> Response:
        if error.wire is not None:
            self.hub.stats.count_error(error.wire)
        return error.response()

"""The HTTP API's door: one request's session, driven as every door drives one (``handle`` its
whole prompt), its frames read from a ``FrameChannel`` instead of a socket and made OpenAI's:
``queued`` while it waits for a slot (the same slots and queue as WebSocket prompts), ``start``,
``token``s as server-sent events or one JSON body, then ``done``. A client that goes away cancels
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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from wschat.protocol import (
    Done,
    Error,
    FinishReason,
    Frame,
    Overloaded,
    Start,
    TokenLogprobs,
    ToolCall,
)
from wschat.protocol import Token as TokenFrame

from ...engine import FunctionCall
from ...sessions import OPENAI_API, Complete, Converse, EngineKeys, GenerationRun, Hub
from .conversation import ReplyIds, reply_key
from .errors import ApiError
from .logprobs import chat_logprobs, completion_logprobs
from .models import model_id
from .requests import Sampling

log = logging.getLogger("wschat.openai_api")

_FINISH = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
}
# A reply cancelled while its client still reads: only a shutdown does that (a client that
# leaves has nobody left to tell)
CUT_SHORT = ApiError.of(Overloaded("the reply was cut short: the server is shutting down"))


class FrameChannel:
    """A session's ``send`` for one HTTP request: each frame waits until the request has taken
    it, so while the client reads slowly the generation merges its tokens, as for a slow socket.
    Once closed (the client is gone) frames are dropped. A reader that sends each frame on
    itself may have them pushed to it instead (``push_to``)."""

    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._changed = asyncio.Event()
        self._push: Callable[[Frame], Awaitable[None]] | None = None
        self.closed = False

    async def __call__(self, frame: Frame) -> None:
        if self.closed:
            return
        if self._push is not None:
            await self._push(frame)
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

    async def push_to(self, push: Callable[[Frame], Awaitable[None]]) -> None:
        """Those frames that waited, then every frame as it is sent, awaited by its sender
        (the generation: a slow ``push`` makes it merge tokens, as a slow reader does)."""
        while self._frames and not self.closed:
            frame = self._frames.popleft()
            self._changed.set()
            await push(frame)
        self._push = push  # none waits now: the next frame comes after this

    def close(self) -> None:
        self.closed = True
        self._frames.clear()
        self._changed.set()


class Reply:
    """One request's run: its session, its frames."""

    def __init__(
        self,
        hub: Hub,
        kind: str,
        keys: EngineKeys,
        *,
        address: str,
        owner: str,
        watch: Request | None = None,
        replies: ReplyIds | None = None,
        api: str = OPENAI_API,
        index: int = 0,
    ) -> None:
        """``owner``: whose prefixes and openings it may share (``access.owner_scope``); its
        runs go under the key ``keys`` gives; the client at ``address`` gets its fair share; a
        client that leaves ``watch`` (its request) cancels it; a chat's reply is remembered in
        ``replies``; its generations are counted under ``api`` (stats.py); ``index``: its place
        among a request's choices (choices.py)."""
        self.hub = hub
        self.index = index
        self.done: Done | None = None  # its done, once streamed
        self.kind = kind  # "chat", "completion" or "response"
        self.replies = replies
        self.frames = FrameChannel()
        self.session = hub.new_request(
            address=address, scope=owner, outbox=self.frames, keys=keys, api=api
        )
        self.run: GenerationRun | None = None
        self.calls: list[ToolCall] = []  # the reply's tool calls, as their frames came
        self.created = int(time.time())
        self._request = watch
        self._watch: asyncio.Task[None] | None = None
        self.logprobs: list[TokenLogprobs] = []  # the token frames', when the request asked
        self._streamed = 0  # characters of the reply streamed so far (a completion's offsets)

    async def begin(self, prompt: Converse | Complete) -> None:
        """Queue the prompt as a session does (its refusals raised as they are)."""
        await self.session.handle(prompt)
        run = self.session.run
        assert run is not None  # an accepted prompt has its run until it ends
        self.run = run
        task = self.session.generation_task
        assert task is not None
        task.add_done_callback(lambda _: self._ended())
        self.hub.requests.add(self.session)  # in /v1/stats while it runs or waits
        if self._request is not None:
            self._watch = asyncio.create_task(self._until_disconnected(self._request))

    def _ended(self) -> None:
        """The run is over: a chat's reply remembered as the ids it was generated as."""
        run = self.run
        assert run is not None
        if self._watch is not None:
            self._watch.cancel()
        self.hub.requests.discard(self.session)
        finished = run.finished
        replies = self.replies if self.kind in ("chat", "response") else None
        if run.kept and finished is not None and replies is not None and run.reason in _FINISH:
            calls = [FunctionCall(c.call_id, c.name, c.arguments) for c in run.sent.calls]
            replies.remember(reply_key(run.sent.text.join(), calls), finished.completion_ids)

    async def _until_disconnected(self, request: Request) -> None:
        with contextlib.suppress(Exception):
            while (await request.receive())["type"] != "http.disconnect":
                pass
        self.cancel()

    def cancel(self) -> None:
        """The client is gone (or the request failed, or its reply was read whole): a run that
        has not ended is cancelled as a WebSocket ``cancel`` does, through its session's core."""
        if self.frames.closed:
            return  # once: the disconnect and the stream's end both come here
        self.frames.close()
        run = self.session.run
        if run is not None and run.reason is None:  # its done not yet decided
            self.session.cancel_run()

    async def first(self) -> Start | ApiError:
        """``start``, or the error that ended the request before it (the run drained)."""
        while True:
            frame = await self.frames.next()
            if isinstance(frame, Start):
                return frame
            if isinstance(frame, Error):
                await self._drain()
                return ApiError.of_frame(frame)
            if isinstance(frame, Done) and self.hub.shutting_down:
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
            elif isinstance(frame, ToolCall):
                self.calls.append(frame)
            elif isinstance(frame, TokenFrame) and frame.logprobs is not None:
                self.logprobs.append(frame.logprobs)
            elif isinstance(frame, Done):
                return frame, error

    async def events(
        self, sampling: Sampling, start: Start, *, whole: bool = True
    ) -> AsyncIterator[bytes]:
        """The reply as server-sent events, ``data: [DONE]`` last; not ``whole`` (one choice of
        several): without the usage chunk and ``[DONE]``, which the choices send once."""
        try:
            if self.kind == "chat":
                yield self.event(self._chunk({"role": "assistant", "content": ""}, None, sampling))
            while (frame := await self.frames.next()) is not None:
                if isinstance(frame, TokenFrame):
                    chunk = self._chunk(self._delta(frame.text), None, sampling, frame.logprobs)
                    self._streamed += len(frame.text)
                    yield self.event(chunk)
                elif isinstance(frame, ToolCall):
                    delta = {"tool_calls": [{"index": frame.index, **_call(frame)}]}
                    yield self.event(self._chunk(delta, None, sampling))
                elif isinstance(frame, Error):
                    yield self.event(ApiError.of_frame(frame).body())
                elif isinstance(frame, Done):
                    self.done = frame
                    reason = _FINISH.get(frame.reason)
                    if reason is not None:
                        yield self.event(self._chunk(self._delta(""), reason, sampling))
                    elif frame.reason is FinishReason.CANCELLED:
                        yield self.event(CUT_SHORT.body())
                    if whole and sampling.include_usage:
                        yield self.event(self.usage_chunk(usage(frame)))
                    if whole:
                        yield b"data: [DONE]\n\n"
                    return
        except Exception as error:  # a failure of ours: the client is told, as a socket is
            log.exception("reply %s failed", self.run.id if self.run else "?")
            yield self.event(ApiError.of(error).body())
        finally:
            self.cancel()  # nothing if it ended; else the client went away mid-stream

    def _delta(self, text: str) -> dict[str, Any]:
        return {"content": text} if self.kind == "chat" else {"text": text}

    def _chunk(
        self,
        delta: dict[str, Any],
        finish: str | None,
        sampling: Sampling,
        logprobs: TokenLogprobs | None = None,
    ) -> dict[str, Any]:
        shown = self._logprobs([logprobs] if logprobs is not None else [])
        if self.kind == "chat":
            choice = {
                "index": self.index,
                "delta": delta,
                "logprobs": shown,
                "finish_reason": finish,
            }
        else:
            choice = {"index": self.index, **delta, "logprobs": shown, "finish_reason": finish}
        chunk = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        chunk["choices"] = [choice]
        if sampling.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, used: dict[str, Any]) -> dict[str, Any]:
        """The stream's last chunk before ``[DONE]``: ``used``, the usage (``usage``'s)."""
        chunk = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        chunk["choices"] = []
        chunk["usage"] = used
        return chunk

    def body(self, done: Done) -> dict[str, Any]:
        reason = _FINISH.get(done.reason, "stop")
        shown = self._logprobs(self.logprobs)
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": done.text}
            if self.calls:  # OpenAI's shape: no content beside the calls when there is none
                message["content"] = done.text or None
                message["tool_calls"] = [_call(call) for call in self.calls]
            choice = {
                "index": self.index,
                "message": message,
                "logprobs": shown,
                "finish_reason": reason,
            }
            body = self._head("chat.completion")
        else:
            choice = {
                "index": self.index,
                "text": done.text,
                "logprobs": shown,
                "finish_reason": reason,
            }
            body = self._head("text_completion")
        body["choices"] = [choice]
        body["usage"] = usage(done)
        return body

    def _logprobs(self, parts: list[TokenLogprobs]) -> dict[str, Any] | None:
        """``parts`` in the endpoint's shape; None where none came (none were asked for)."""
        if not parts:
            return None
        if self.kind == "chat":
            return chat_logprobs(parts)
        return completion_logprobs(parts, self._streamed)

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
    def event(data: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _call(call: ToolCall) -> dict[str, Any]:
    """A tool call in OpenAI's shape (a chunk's delta gives it whole, with its ``index``)."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": call.call_id, "type": "function", "function": function}


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

"""One response's run, whichever way it was asked for (HTTP, streamed or not, or a WebSocket's
``response.create``): a ``Reply`` (openai_api/reply.py: a session of its own from
``Hub.new_request``, fed a ``Converse`` as a chat completion's is: the same checks, slots,
engine path and events), its frames made the response's events (shapes.py), and what it became
kept (kept.py) for ``GET`` and ``previous_response_id``.

``Responses`` is what the door shares: the responses kept, those running (for ``GET`` and
``cancel`` by id), and the chat API's engine keys and remembered replies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from wschat.protocol import Done, Error, Frame, Start, ToolCall
from wschat.protocol import Token as TokenFrame

from ...engine import FunctionCall
from ...sessions import EngineKeys, Hub, ReplySaid, Said
from ..openai_api.conversation import ReplyIds
from ..openai_api.errors import ApiError, invalid
from ..openai_api.models import model_id
from ..openai_api.reply import Reply
from .conversation import converse_of
from .kept import Kept, KeptResponses
from .request import CreateBody
from .shapes import Event, ResponseShape, new_id

log = logging.getLogger("wschat.responses")


def not_found(response_id: str, param: str | None = None) -> ApiError:
    """What a response that is not the asker's gets, whether it exists or not: the same words."""
    shown = response_id if len(response_id) <= 80 else response_id[:79] + "…"
    if param == "previous_response_id":
        message = f"Previous response with id {shown!r} not found."
        return ApiError(message, param=param, code="previous_response_not_found")
    return ApiError(f"No response found with id {shown!r}.", status=404, code="not_found")


class Responses:
    def __init__(self, hub: Hub, replies: ReplyIds) -> None:
        self.hub = hub
        self.replies = replies  # the chat API's: a reply sent back as text, as its ids
        s = hub.settings
        self.kept = KeptResponses(s.responses_kept, s.responses_kept_mib << 20, s.responses_kept_s)
        self.running: dict[str, ResponseRun] = {}

    def previous(self, response_id: str, owner: str) -> Kept:
        """The owner's response that a create continues, ended; else not found."""
        kept = self.kept.get(response_id, owner)
        if kept is not None:
            return kept
        running = self.running.get(response_id)
        if running is not None and running.owner == owner:
            raise invalid(f"response {response_id!r} has not ended yet", "previous_response_id")
        raise not_found(response_id, "previous_response_id")

    async def start(
        self,
        body: CreateBody,
        previous: Kept | None,
        *,
        owner: str,
        address: str,
        keys: EngineKeys,
        api: str,
        watch: Request | None = None,
        stream_id: str | None = None,
        on_kept: Callable[[Kept], None] | None = None,
    ) -> ResponseRun:
        """The response queued as a session's prompt (its refusal raised as the session raised
        it); ``keys``: the engine session key it runs under (the owner's prefix keys over HTTP,
        its lane's on a socket); ``watch``: the HTTP request whose client leaving cancels it;
        ``on_kept``: told what it became, however it was stored."""
        engine = self.hub.engine
        assert engine is not None  # admitted: the model is loaded
        response_id = new_id("resp")
        converse, system = converse_of(response_id, body, previous, self.replies)
        shape = ResponseShape(response_id, model_id(engine.info), body, stream_id)
        reply = Reply(
            self.hub,
            "response",
            keys,
            address=address,
            owner=owner,
            watch=watch,
            replies=self.replies,
            api=api,
        )
        run = ResponseRun(self, reply, shape, owner, on_kept)
        run.conversation = (system, (*converse.history, converse.user))
        try:
            await reply.begin(converse)
        except BaseException:
            reply.cancel()  # what began of it ends: its slot is given back
            raise
        self.running[response_id] = run
        task = reply.session.generation_task
        assert task is not None  # an accepted prompt has its run until it ends
        task.add_done_callback(lambda _: run.run_ended())
        return run


class ResponseRun:
    def __init__(
        self,
        responses: Responses,
        reply: Reply,
        shape: ResponseShape,
        owner: str,
        on_kept: Callable[[Kept], None] | None,
    ) -> None:
        self.responses = responses
        self.reply = reply
        self.shape = shape
        self.owner = owner
        self.on_kept = on_kept
        # its conversation's system text and messages (its input's), as a continuation takes it
        self.conversation: tuple[str | None, tuple[Said, ...]] = (None, ())
        self.error: ApiError | None = None  # the error frame its reply sent, if any
        self.started = False
        self.ended = False

    @property
    def id(self) -> str:
        return self.shape.id

    async def first(self) -> Start | ApiError:
        """``start``, or the error that ended it before (then nothing of it is kept)."""
        first = await self.reply.first()
        self.started = isinstance(first, Start)
        return first

    def events_of(self, frame: Frame) -> list[Event]:
        """The events a frame of its reply makes, once ``first`` gave ``start`` (``done``'s:
        its end, kept as it became)."""
        if isinstance(frame, TokenFrame):
            return self.shape.delta(frame.text)
        if isinstance(frame, ToolCall):
            return self.shape.call(frame.call_id, frame.name, frame.arguments)
        if isinstance(frame, Error):
            self.error = ApiError.of_frame(frame)
        elif isinstance(frame, Done):
            self._end(frame)
            return self.shape.closing()
        return []

    async def events(self) -> AsyncIterator[Event]:
        """Its stream's events, from ``response.created`` to its end, once ``first`` gave
        ``start``; a consumer that stops early cancels it."""
        try:
            for event in self.shape.opening():
                yield event
            while not self.ended and (frame := await self.reply.frames.next()) is not None:
                for event in self.events_of(frame):
                    yield event
        finally:
            self.reply.cancel()  # nothing if it ended; else its reader is gone

    async def send_events(self, send: Callable[[Event], Awaitable[bool]]) -> None:
        """``events`` each sent by ``send`` (False: the peer is gone, and it is cancelled), from
        the task that sends its reply's frames, as a chat socket's frames are sent: no hand-off
        to another task per token. Returns once it ended; a failure of ours is raised here."""
        over: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def push(frame: Frame) -> None:
            if over.done():
                return
            try:
                for event in self.events_of(frame):
                    if not await send(event):
                        break
                else:
                    if not self.ended:
                        return
                over.set_result(None)
            except Exception as error:  # told where it is awaited, not to the generation
                over.set_exception(error)

        def run_ended(_: object) -> None:  # without its done (a run always sends one): over
            if not over.done():
                over.set_result(None)

        task = self.reply.session.generation_task
        if task is not None:
            task.add_done_callback(run_ended)
        try:
            for event in self.shape.opening():
                if not await send(event):
                    return
            await self.reply.frames.push_to(push)
            await over
        finally:
            self.reply.cancel()  # nothing if it ended; else its peer is gone

    def cancel(self) -> None:
        """Cancel it; its stream, if read, still ends with its terminal event."""
        self.reply.session.cancel_run()

    def run_ended(self) -> None:
        """Its generation is over: what it became is kept, if its reader left before."""
        run = self.reply.run
        if not self.ended and self.started and run is not None and run.reason is not None:
            self._end(run.done_frame(run.reason))
        self.responses.running.pop(self.id, None)

    def _end(self, done: Done) -> None:
        self.ended = True
        self.shape.ended(done, self.error)
        self.responses.running.pop(self.id, None)
        system, said = self.conversation
        run = self.reply.run
        finished = run.finished if run is not None else None
        if run is not None and run.kept:
            ids = finished.completion_ids if finished is not None else None
            calls = tuple(FunctionCall(c.call_id, c.name, c.arguments) for c in run.sent.calls)
            said = (*said, ReplySaid(done.text, ids or None, calls))
        kept = Kept(self.id, self.owner, self.shape.object(), system, said)
        if self.shape.body.store and not self.responses.kept.add(kept):
            log.warning("response %s is over --responses-kept-mib alone: not kept", self.id)
        if self.on_kept is not None:
            self.on_kept(kept)

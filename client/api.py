"""The public client: ``async with connect(url) as chat: async for piece in chat.prompt("...")``.

A ``Chat`` talks over a ``Link`` (link.py): its connection, a reader task that routes each
server frame and a writer task that sends queued frames in order; the link resumes a dropped
connection.

Concurrency: ``prompt`` and ``regenerate`` return at once (their frame is queued); every other
request waits for the server's answer, at most ``timeout`` seconds (``TimeoutError``). One
generation runs at a time per session: a second ``prompt`` while one runs raises ``BusyError``
from its reply, and so do ``rewind`` and ``edit`` (PROTOCOL.md section 5).

Exchanges (a user message and its reply) are numbered from 1 as the server numbers them
(``done.turn``); ``turns`` is how many the conversation holds, so ``edit(k, ...)`` and
``rewind(k - 1)`` name an exchange without counting.

A dropped connection is resumed when ``connect`` says so (link.py, PROTOCOL.md section 10): the
reply in flight goes on where it was; what a resume that fails ends with is said there. So is a
server that goes away (``goaway``, close 1001 or 1012), once its reply running there has ended.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.client import ClientConnection
from wschat.protocol import (
    Cancel,
    Capabilities,
    Configure,
    Configured,
    GoAway,
    Image,
    ImageOk,
    Limits,
    Ping,
    Pong,
    Prompt,
    Ready,
    Regenerate,
    Reset,
    ResetOk,
    Rewind,
    Rewound,
    ServerFrame,
    ToolResult,
    ToolResults,
    encode,
)

from .connection import FrameRouter
from .errors import ClientError, ConnectionClosedError, InvalidParamsError
from .images import ImageInput, image_bytes
from .link import Link, Reopen
from .local import check_frame_size, check_image_size, check_prompt_id, local_params
from .reply import Reply
from .tools import ToolLoop

DEFAULT_TIMEOUT = 30.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Chat:
    """One session on a wschat server. Build it with ``connect()``."""

    def __init__(
        self,
        ws: ClientConnection,
        ready: Ready,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        reply_timeout: float | None = None,
        on_goaway: Callable[[GoAway], None] | None = None,
        reopen: Reopen | None = None,
        on_resume: Callable[[Ready], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.reply_timeout = reply_timeout
        self._told_goaway = on_goaway
        self._router = FrameRouter(
            self._on_goaway, turns=ready.resumed.turns if ready.resumed else 0
        )
        self._link = Link(ws, ready, self._router, reopen=reopen, on_resume=on_resume)
        self._id_prefix = secrets.token_hex(3)  # ids stay unique across resumed connections
        self._next_id = 0
        self._ping_seq = 0

    # -- what the server said about the session ------------------------------------------------

    @property
    def ready(self) -> Ready:
        """The server's last ``ready`` (a resume's, after one)."""
        return self._link.ready

    @property
    def resumes(self) -> int:
        """How many times a dropped or left connection was resumed."""
        return self._link.resumes

    @property
    def session(self) -> str:
        return self.ready.session

    @property
    def resume_token(self) -> str:
        """Pass as ``connect(url, resume=..., session=chat.session)`` to pick the conversation
        up after a drop."""
        return self.ready.resume

    @property
    def model(self) -> str:
        return self.ready.model

    @property
    def capabilities(self) -> Capabilities:
        return self.ready.capabilities

    @property
    def limits(self) -> Limits:
        return self.ready.limits

    @property
    def turns(self) -> int | None:
        """How many exchanges the conversation holds, as the server's frames said (None when
        its server does not say): after ``n`` kept replies, ``n``; exchange ``k`` is the
        ``k``-th of them (a reply's ``turn``)."""
        return self._router.turns

    @property
    def goaway(self) -> GoAway | None:
        """The server's ``goaway`` once it said it is shutting down (None again once the session
        resumed elsewhere, which the chat does on its own when ``connect`` resumes)."""
        return self._router.goaway

    @property
    def closed(self) -> ConnectionClosedError | None:
        """Why the connection ended, or None while it is open."""
        return self._router.closed

    @property
    def unrouted(self) -> list[ServerFrame]:
        """The latest frames that matched no live request or reply (kept for inspection)."""
        return list(self._router.unrouted)

    # -- requests ------------------------------------------------------------------------------

    def prompt(
        self,
        text: str,
        *,
        images: Iterable[ImageInput] | None = None,
        id: str | None = None,
        **params: Any,
    ) -> Reply:
        """Send a prompt; the returned ``Reply`` streams its pieces.

        ``params`` are the protocol's sampling parameters (``max_new_tokens=64``,
        ``temperature=0.7``...), checked here before anything is sent: ``InvalidParamsError``.
        ``images`` are paths, encoded bytes or PIL images; one over ``limits.max_image_bytes``
        raises ``TooLargeError`` (a text-only model answers ``UnsupportedError`` from the reply).
        """
        return self._start_reply(self._prompt_frame(text, images, id, params))

    def regenerate(self, *, id: str | None = None, **params: Any) -> Reply:
        """A new reply in place of the conversation's last one, to the same user message and
        images (the server keeps them); the returned ``Reply`` streams like ``prompt``'s.

        ``params`` go over the session's defaults as a prompt's do (the replaced reply's own
        are not reused): ``temperature=0.8, seed=7``; with no ``seed`` each try samples anew.
        The old reply goes once the new one is kept; a regenerate that fails (``done`` reason
        ``error``) or is cancelled while queued leaves it, and its ``done.turn`` is None. An
        empty conversation raises ``InvalidParamsError`` from the reply.
        """
        frame = Regenerate(self._reply_id(id), local_params(params))
        return self._start_reply((frame.id, self._encoded(frame)))

    def tool_results(
        self, results: Mapping[str, str], *, id: str | None = None, **params: Any
    ) -> Reply:
        """Hand back what the last reply's tool calls answered, ``{call_id: result}`` one per
        call (``reply.calls``), and start the next reply of the same exchange, returned."""
        answers = tuple(ToolResult(call_id, text) for call_id, text in results.items())
        frame = ToolResults(self._reply_id(id), answers, local_params(params))
        return self._start_reply((frame.id, self._encoded(frame)))

    def run(
        self,
        text: str,
        *,
        images: Iterable[ImageInput] | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        **params: Any,
    ) -> ToolLoop:
        """A prompt with ``tools`` (each ``{name, description?, parameters?}``) and the replies
        after it while the model calls them: ``async for event in chat.run(...)`` yields text
        pieces and ``CallRequest``s to answer (client/tools.py). ``params`` as ``prompt``'s
        (``tool_choice="required"``, ``parallel_tool_calls=False``); each reply after results
        is offered the same tools with ``tool_choice`` ``auto`` (a required call each time would
        never end), and the same other params."""
        offered = {**params, "tools": list(tools)} if tools else params
        first = self.prompt(text, images=images, **offered)
        after = {**offered, "tool_choice": "auto"} if tools else offered
        return ToolLoop(first, lambda answers: self.tool_results(answers, **after))

    async def edit(
        self,
        turn: int,
        text: str,
        *,
        images: Iterable[ImageInput] | None = None,
        id: str | None = None,
        **params: Any,
    ) -> Reply:
        """Replace user message ``turn`` (1 = the first) with ``text``: the exchanges from
        ``turn`` on go (``rewind(turn - 1)``), then ``text`` is prompted; its ``Reply``.

        The old message's images are not kept: pass them again in ``images``. ``turn`` past the
        conversation raises ``InvalidParamsError`` and changes nothing; a refused prompt leaves
        the conversation rewound.
        """
        if not _is_int(turn):
            raise TypeError(f"turn must be an int, not {type(turn).__name__}")
        if self.turns == 0:
            raise InvalidParamsError("the conversation holds no message to edit")
        if turn < 1 or (self.turns is not None and turn > self.turns):
            held = "" if self.turns is None else f"; the conversation holds {self.turns}"
            raise InvalidParamsError(f"there is no message {turn} to edit{held}")
        prompt = self._prompt_frame(text, images, id, params)  # checked before it rewinds
        await self.rewind(turn - 1)
        return self._start_reply(prompt)

    async def rewind(self, keep: int) -> int:
        """Keep the first ``keep`` exchanges of the conversation and drop the rest (0: all of
        them); how many it holds now. The system prompt, default params and staged images
        stay, and the next prompt reuses what the server cached of the kept ones.

        ``keep`` over what it holds or below 0 raises ``InvalidParamsError``, and while a
        generation runs or waits ``BusyError``; neither changes anything.
        """
        if not _is_int(keep):
            raise TypeError(f"keep must be an int, not {type(keep).__name__}")
        answer = await self._request(encode(Rewind(keep)), Rewound)
        assert isinstance(answer, Rewound)
        return answer.turns

    async def cancel(self, id: str | None = None) -> None:
        """Stop the running generation (the one named ``id``, or whichever runs).

        Returns once the server has handled it; ``NotRunningError`` when ``id`` names no
        generation of this session. Cancelling one that already finished is not an error.
        """
        waiter = self._router.expect(None, id) if id is not None else None
        try:
            self._send(encode(Cancel(id)))
            await self._ping()  # the server answers in order: a refusal comes before the pong
            if waiter is not None and waiter.future.done():
                waiter.future.result()
        finally:
            if id is not None:
                self._router.forget(id)

    async def reset(self) -> None:
        """Cancel any running generation (its reply ends ``cancelled`` first) and clear the
        conversation; the system prompt stays."""
        await self._request(encode(Reset()), ResetOk)

    async def configure(self, system: str | None = None, **params: Any) -> None:
        """Set the system prompt (starting the conversation afresh) and/or default params."""
        checked = local_params(params) if params else None
        await self._request(encode(Configure(system, checked)), Configured)
        if system is not None:
            self._router.turns = 0

    async def ping(self) -> float:
        """Round trip to the server and back through the session, in seconds."""
        return await self._ping()

    async def image(self, image: ImageInput, *, mime: str | None = None) -> ImageOk:
        """Stage an image for the next prompt; ``ImageOk`` carries its width and height."""
        data, sniffed = image_bytes(image)
        check_image_size(data, self.limits)
        frame_id = self._new_id()
        frame = encode(Image(frame_id, data, mime or sniffed))
        check_frame_size(frame, self.limits)
        answer = await self._request(frame, ImageOk, frame_id)
        assert isinstance(answer, ImageOk)
        return answer

    # -- plumbing ------------------------------------------------------------------------------

    def _on_goaway(self, frame: GoAway) -> None:
        self._link.leave()
        if self._told_goaway is not None:
            self._told_goaway(frame)

    def _reply_id(self, id: str | None) -> str:
        return check_prompt_id(id, self._router.replies) if id is not None else self._new_id()

    def _prompt_frame(
        self, text: str, images: Iterable[ImageInput] | None, id: str | None, params: Any
    ) -> tuple[str, bytes]:
        """A prompt's id and frame, checked as the server would."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        frame_id = self._reply_id(id)
        if isinstance(images, str | bytes | os.PathLike):
            raise TypeError("images takes a list of images, not a single one")
        blobs = tuple(image_bytes(image)[0] for image in images or ())
        for blob in blobs:
            check_image_size(blob, self.limits)
        return frame_id, self._encoded(Prompt(frame_id, text, blobs, local_params(params)))

    def _encoded(self, frame: Prompt | Regenerate | ToolResults) -> bytes:
        data = encode(frame)
        check_frame_size(data, self.limits)
        return data

    def _start_reply(self, frame: tuple[str, bytes]) -> Reply:
        """Queue a generation's frame (its id and bytes); the reply it starts."""
        frame_id, data = frame
        self._raise_if_closed()
        reply = Reply(frame_id, send_cancel=self._send_cancel, timeout=self.reply_timeout)
        reply.prompt_frame = data
        self._router.add_reply(reply)
        self._link.send(data, reply)
        return reply

    def _new_id(self) -> str:
        self._next_id += 1
        return f"{self._id_prefix}-{self._next_id}"

    def _raise_if_closed(self) -> None:
        if self._router.closed is not None:
            raise self._router.closed

    def _send(self, data: bytes) -> None:
        self._raise_if_closed()
        self._link.send(data)

    def _send_cancel(self, id: str) -> None:
        if self._router.closed is None:
            self._link.send(encode(Cancel(id)))

    async def _request(
        self, data: bytes, expects: type[ServerFrame], id: str | None = None
    ) -> ServerFrame:
        self._raise_if_closed()
        waiter = self._router.expect(expects, id)
        self._link.send(data)
        try:
            async with asyncio.timeout(self.timeout):
                return await waiter.future
        finally:
            if id is not None:
                self._router.forget(id)

    async def _ping(self) -> float:
        self._ping_seq += 1
        seq = self._ping_seq
        sent = time.perf_counter()
        pong = await self._request(encode(Ping(seq)), Pong)
        if not isinstance(pong, Pong) or pong.t != seq:
            raise ClientError(f"the server's pong does not echo ping {seq}")
        return time.perf_counter() - sent

    async def close(self) -> None:
        """Close the connection (1000); replies still running end with ``ConnectionClosedError``."""
        await self._link.close()

    async def wait_closed(self) -> ConnectionClosedError:
        """Wait until the server closes the connection; why it closed."""
        await asyncio.shield(self._link.reader)
        assert self._router.closed is not None
        return self._router.closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

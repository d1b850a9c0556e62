"""``GenerationRun``: one prompt's life from queue to ``done``, turning engine items into frames.

Token text that piles up while the socket is slow is merged into one ``token`` frame (its index
jumps); nothing is dropped (PROTOCOL.md "Server frames"). A reply that calls tools sends each call
as a ``tool_call`` frame once it is whole, not as text, and ends ``tool_calls`` (engine
tool_calls.py reads them); one whose arguments break its tool's schema fails the reply. Exactly
one ``done`` is sent per run, from ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from wschat.protocol import (
    Done,
    FinishReason,
    Internal,
    Queued,
    Start,
    Timing,
    Token,
    TokenLogprobs,
    ToolCall,
    Usage,
)

from ..engine import (
    CallArgumentsInvalid,
    CallReader,
    Chat,
    EngineError,
    Finished,
    FunctionCall,
    Generation,
    Logprob,
    PreparedTurn,
    TokenPiece,
)
from .error_boundary import Send, error_frame
from .events import RunDone, RunEvent, RunListener, RunStarted, TokensSent
from .relay import ReplyRecord
from .slots import GenerationSlots, Ticket

log = logging.getLogger("wschat.run")


@dataclass(eq=False)
class GenerationRun:
    id: str
    prepared: PreparedTurn
    ticket: Ticket
    token_ids: bool = False
    stall_timeout_s: float = 120.0
    key: str | None = None  # the engine session key it runs under (None: its chat's)
    scope: str = ""  # whose cached state it may share (engine/history.py ``Chat.start``)
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    generation: Generation | None = None
    # What was sent, packed, so a long reply to a slow reader costs about its text and ids, not
    # an object per frame; the relay reads it for a resume, a checkpoint its ids.
    sent: ReplyRecord = field(default_factory=ReplyRecord)
    finished: Finished | None = None
    reason: FinishReason | None = None  # the done's, once sent
    completion_tokens: int = 0
    received_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    listeners: list[RunListener] = field(default_factory=list)
    reader: CallReader = field(init=False)  # the reply's text, and the calls it makes
    # logprobs of tokens whose text the reader holds back (``_sent``)
    _logprobs_held: list[Logprob] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.reader = CallReader(self.prepared.turn.tools, self.prepared.call_seed)

    @property
    def kept(self) -> bool:
        """Ended, its exchange in the conversation: it started and did not fail."""
        return self.generation is not None and self.reason not in (None, FinishReason.ERROR)

    def kept_ids(self) -> list[int] | None:
        """What the engine keeps under the run's key once it ended: its prompt and its reply
        (None: nothing worth keeping, a reply that failed or never started)."""
        finished = self.finished
        if not self.kept or finished is None:
            return None
        return [*self.prepared.prompt_ids, *finished.completion_ids]

    def cancel(self) -> None:
        self.cancel_requested.set()
        if self.generation is not None:
            self.generation.cancel()

    async def drive(self, chat: Chat, slots: GenerationSlots, send: Send) -> None:
        reason = FinishReason.CANCELLED
        try:
            if await self._wait_for_slot(send):
                self.started_at = time.perf_counter()
                self.generation = chat.start(self.prepared, key=self.key, scope=self.scope)
                if self.cancel_requested.is_set():
                    self.generation.cancel()
                # told before the start frame goes: the session is RUNNING once the chat holds
                # the running turn, with nothing awaited in between
                self._notify(RunStarted(self))
                await send(self._start_frame())
                reason = await self._stream(send, chat)
            elif (pushed_out := self.ticket.pushed_out) is not None:  # slots.py: fair share
                await send(error_frame(pushed_out, self.id))
                reason = FinishReason.ERROR
        except Exception:
            # a failure of ours (the start raised, a frame could not be sent): the client is
            # told as for any failed reply, error then done, and the session goes on
            log.exception("generation %s failed", self.id)
            reason = FinishReason.ERROR
            if self.generation is not None:
                self.generation.cancel()
            await self._told(send, Internal("generation failed"))
        except BaseException:
            reason = FinishReason.ERROR
            if self.generation is not None:
                self.generation.cancel()
            raise
        finally:
            slots.release(self.ticket)
            await self._finish(send, reason)

    async def _wait_for_slot(self, send: Send) -> bool:
        """True once a slot is granted; False when cancelled or pushed out while queued."""
        ticket = self.ticket
        cancel = asyncio.ensure_future(self.cancel_requested.wait())
        try:
            while not ticket.granted:
                if ticket.pushed_out is not None:
                    return False
                # cleared before the send: a grant or a push-out while it is handed over (a
                # send may switch tasks) leaves ``moved`` set, and the wait below sees it
                ticket.moved.clear()
                await send(Queued(self.id, ticket.position))
                moved = asyncio.ensure_future(ticket.moved.wait())
                await asyncio.wait({moved, cancel}, return_when=asyncio.FIRST_COMPLETED)
                moved.cancel()
                if cancel.done() and not ticket.granted:
                    return False
            return True
        finally:
            cancel.cancel()

    async def _stream(self, send: Send, chat: Chat) -> FinishReason:
        assert self.generation is not None
        self.reader.limit(chat.budget(self.prepared))
        after_calls = False  # ended after its whole calls (engine tool_calls.py ``full``)
        while True:
            try:
                async with asyncio.timeout(self.stall_timeout_s):
                    items = await self.generation.next_items()
            except TimeoutError:
                return await self._stalled(send)
            # what waited, merged by the generation: at most one piece, then at most the end
            piece = items[0] if isinstance(items[0], TokenPiece) else None
            finished = items[-1] if isinstance(items[-1], Finished) else None
            text, ids = (piece.text, piece.ids) if piece else ("", ())
            if piece is not None:
                self.last_token_at = time.perf_counter()
                if text and self.first_token_at is None:
                    self.first_token_at = self.last_token_at
            self.completion_tokens += len(ids)  # ids without text too: the next index jumps
            try:
                shown, calls = self.reader.feed(text, self.completion_tokens)
            except CallArgumentsInvalid as bad:
                return await self._bad_call(send, chat, bad)
            await self._sent(send, ids, shown, calls, piece.logprobs if piece else ())
            if calls and self.reader.full and not after_calls:
                after_calls = True
                chat.end_after_calls(self.generation, self.reader.calls)
            if finished is not None:
                self.finished = finished
                try:
                    rest, calls, calling = self.reader.finish()
                except CallArgumentsInvalid as bad:
                    return await self._bad_call(send, chat, bad)
                await self._sent(send, (), rest, calls)
                if finished.reason is FinishReason.ERROR:
                    error = finished.error
                    log.error("generation %s failed: %s", self.id, error or "no reason given")
                    # the engine's words only when it wrote them for clients (an EngineError)
                    told = error if isinstance(error, EngineError) else None
                    await send(error_frame(told or Internal("generation failed"), self.id))
                # whole calls are the reply's end, however it stopped (engine history.py)
                if (calling or after_calls) and finished.reason is not FinishReason.ERROR:
                    return FinishReason.TOOL_CALLS
                return finished.reason

    async def _sent(
        self,
        send: Send,
        ids: tuple[int, ...],
        text: str,
        calls: list[FunctionCall],
        logprobs: Sequence[Logprob] = (),
    ) -> None:
        """Send the text to show (a ``token`` frame) and the calls that are whole; ``ids`` are
        counted as sent either way (a call's text is sent as its ``tool_call`` frames). Logprobs
        of tokens whose text is held back go with the next frame."""
        frame = None
        self._logprobs_held += logprobs
        if text:
            shown = token_logprobs(self._logprobs_held)
            self._logprobs_held = []
            frame = Token(
                self.id, text, self.completion_tokens, ids if self.token_ids else None, shown
            )
        self.sent.add(ids, frame)
        if ids or frame is not None:
            self._notify(TokensSent(self, len(ids)))
        if frame is not None:
            await send(frame)
        for call in calls:
            called = ToolCall(self.id, len(self.sent.calls), call.id, call.name, call.arguments)
            self.sent.calls.append(called)
            await send(called)

    async def _bad_call(self, send: Send, chat: Chat, error: CallArgumentsInvalid) -> FinishReason:
        """A call whose arguments break its tool's schema: the reply fails (error, then done),
        the conversation keeps no exchange of it, and the session goes on."""
        assert self.generation is not None
        chat.discard(self.generation)
        log.error("generation %s failed: %s", self.id, error)
        await send(error_frame(error, self.id))
        return FinishReason.ERROR

    async def _stalled(self, send: Send) -> FinishReason:
        """No progress for stall_timeout_s: cancel, tell the client, free the slot."""
        assert self.generation is not None
        self.generation.cancel()
        log.error("generation %s made no progress for %.0f s", self.id, self.stall_timeout_s)
        stopped = Internal("generation made no progress and was stopped")
        await send(error_frame(stopped, self.id))
        with contextlib.suppress(TimeoutError):  # its end, so the chat keeps the exchange
            async with asyncio.timeout(5):
                async for _ in self.generation.items():
                    pass
        return FinishReason.ERROR

    async def _finish(self, send: Send, reason: FinishReason) -> None:
        self.reason = reason
        done = self.done_frame(reason)
        self._notify(RunDone(self, done))
        try:
            await send(done)
        except Exception:  # a done that cannot be sent (a bug of ours): a bare one after an error
            log.exception("generation %s: its done could not be sent", self.id)
            self.reason = FinishReason.ERROR
            await self._told(send, Internal("generation failed"))
            await send(self._bare_done())
        finally:
            self.sent.settle()

    async def _told(self, send: Send, error: Exception) -> None:
        """Send ``error``'s frame; one that cannot be sent is logged (the done still follows)."""
        try:
            await send(error_frame(error, self.id))
        except Exception:
            log.exception("generation %s: its error could not be sent", self.id)

    def _bare_done(self) -> Done:
        """A failed reply's done from nothing but its id: what the last line of defence sends."""
        return Done(self.id, FinishReason.ERROR, "", Usage(0, 0, 0), Timing(0.0, None, 0.0, 0.0))

    def done_frame(self, reason: FinishReason) -> Done:
        now = time.perf_counter()
        # kept (it started and did not fail): the chat holds it as this exchange
        kept = self.generation is not None and reason is not FinishReason.ERROR
        return Done(
            self.id,
            reason,
            *self._reply(),
            Timing(
                queued_ms=self.queued_ms,
                ttft_ms=_ms(self.received_at, self.first_token_at),
                decode_tokens_per_s=self._decode_rate(),
                total_ms=(now - self.received_at) * 1000,
            ),
            self.prepared.index if kept else None,
        )

    def _reply(self) -> tuple[str, Usage]:
        """The engine's text and usage once its ``Finished`` was streamed; else what was sent."""
        finished = self.finished
        if finished is not None and finished.usage is not None:
            return self.sent.text.join(), finished.usage
        generation = self.generation
        prompt_tokens = generation.prompt_tokens if generation else 0
        cached = generation.cached_tokens if generation else 0
        return self.sent.text.join(), Usage(prompt_tokens, self.completion_tokens, cached)

    @property
    def queued_ms(self) -> float:
        end = self.started_at or time.perf_counter()
        return (end - self.received_at) * 1000

    def _decode_rate(self) -> float:
        if self.first_token_at is None or self.last_token_at is None or self.completion_tokens < 2:
            return 0.0
        span = self.last_token_at - self.first_token_at
        return (self.completion_tokens - 1) / span if span > 0 else 0.0

    def _start_frame(self) -> Start:
        assert self.generation is not None
        generation = self.generation
        return Start(self.id, generation.prompt_tokens, generation.cached_tokens, self.queued_ms)

    def _notify(self, event: RunEvent) -> None:
        for listener in self.listeners:
            listener(event)


def token_logprobs(entries: Sequence[Logprob]) -> TokenLogprobs | None:
    """A frame's tokens' logprobs as the wire lists them (None: none were asked for); every
    token with as many alternatives as the one with fewest (an engine over HTTP may give some
    fewer)."""
    if not entries:
        return None
    top = min(len(entry.top) for entry in entries)
    best = [choice for entry in entries for choice in entry.top[:top]]
    return TokenLogprobs(
        tuple(entry.chosen.id for entry in entries),
        tuple(entry.chosen.text for entry in entries),
        tuple(entry.chosen.bytes for entry in entries),
        tuple(entry.chosen.logprob for entry in entries),
        top,
        tuple(choice.id for choice in best),
        tuple(choice.text for choice in best),
        tuple(choice.bytes for choice in best),
        tuple(choice.logprob for choice in best),
    )


def _ms(start: float, end: float | None) -> float | None:
    return None if end is None else (end - start) * 1000

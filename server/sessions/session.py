"""``Session``: one connection's conversation, defaults and rules.

The rules are two tables, read top to bottom: ``TRANSITIONS`` (what moves the state) and, at the
end of this module, ``Session.RULES`` (which handler each frame type gets in each state). Whether
the session is busy is its state and nothing else.

    IDLE --prompt (or regenerate) accepted--> QUEUED --slot granted--> RUNNING --run ended--> IDLE
    QUEUED --run ended (cancelled while queued)--> IDLE
    RUNNING --dropped--> RUNNING_DETACHED --resumed--> RUNNING
    RUNNING_DETACHED --run ended (or the grace ran out: cancelled)--> IDLE
    any --close--> CLOSED   (no resume window, detach expiry, shutdown)

"Dropped" is a connection that ended mid-reply without a close frame (PROTOCOL.md section 10):
the reply goes on without it for ``--resume-grace-s``, its frames kept by the ``Relay``
(relay.py) for the connection that resumes the session; a clean close, ``cancel``, ``reset``
and shutdown cancel it at once, as a drop does before the reply's first token (a queued prompt
included): nothing of it to resume. No frame reaches a detached session: no connection feeds
it.

The session does no I/O of its own: the connection feeds it decoded frames (``handle``) and
every frame it sends, its generation's included, goes out through ``send``, its relay to the
connection's outbox (error_boundary.py). A frame its state refuses raises a typed
``ProtocolError`` (``busy``), which the connection turns into an ``error`` frame; a state
change the table does not list is our bug (``SessionMisuse``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from wschat.protocol import (
    Busy,
    Cancel,
    ClientFrame,
    Configure,
    Configured,
    GenerationParams,
    Image,
    ImageOk,
    InvalidParams,
    NotRunning,
    Ping,
    Pong,
    Prompt,
    Regenerate,
    Reset,
    ResetOk,
    Rewind,
    Rewound,
    SessionMisuse,
)
from wschat.protocol.frames import CLIENT_FRAMES

from ..engine import Chat, Engine, PreparedTurn, Turn
from ..settings import Settings
from .error_boundary import Send
from .events import RunEvent, RunListener, RunStarted, TokensSent
from .gates import Gate
from .generation import GenerationRun
from .limits import MIN_TURN_TOKENS, PromptLimits
from .relay import CatchUp, KeptReply, Relay
from .slots import GenerationSlots

if TYPE_CHECKING:
    from .images import CheckedImage, ImageRules

log = logging.getLogger("wschat.session")

Handler = Callable[["Session", Any], Awaitable[None]]


class SessionState(Enum):
    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    RUNNING_DETACHED = "running, detached"
    CLOSED = "closed"


class Change(Enum):
    """What moves a session from one state to another."""

    ACCEPTED = "prompt or regenerate accepted"
    STARTED = "slot granted"
    ENDED = "run ended"
    DROPPED = "dropped mid-reply"
    RESUMED = "resumed"
    CLOSE = "close"


IDLE, QUEUED, RUNNING, RUNNING_DETACHED, CLOSED = SessionState

# (state, change) -> next state; a pair not listed is our bug, never the peer's.
TRANSITIONS: dict[SessionState, dict[Change, SessionState]] = {
    IDLE: {Change.ACCEPTED: QUEUED, Change.CLOSE: CLOSED},
    QUEUED: {Change.STARTED: RUNNING, Change.ENDED: IDLE, Change.CLOSE: CLOSED},
    RUNNING: {Change.ENDED: IDLE, Change.DROPPED: RUNNING_DETACHED, Change.CLOSE: CLOSED},
    RUNNING_DETACHED: {Change.ENDED: IDLE, Change.RESUMED: RUNNING, Change.CLOSE: CLOSED},
    CLOSED: {Change.CLOSE: CLOSED},
}
BUSY_STATES = frozenset({QUEUED, RUNNING, RUNNING_DETACHED})
DETACHED_STATES = frozenset({RUNNING_DETACHED})


class Session:
    def __init__(
        self,
        key: str,
        engine: Engine,
        slots: GenerationSlots,
        settings: Settings,
        *,
        image_checks: Gate | None = None,
    ) -> None:
        self.key = key
        self.engine = engine
        self.slots = slots
        self.settings = settings
        self.limits = PromptLimits.of(settings)
        self.chat = Chat(engine, key)  # the conversation, as token ids per turn
        self.defaults = GenerationParams()
        self.state = SessionState.IDLE
        self.run: GenerationRun | None = None
        self.last_active_at = time.monotonic()  # when its last generation ended
        self.max_images = min(settings.max_images, engine.info.max_images)
        # the server's (hub.py); a session made on its own checks under a gate of its own
        self.image_checks = image_checks or Gate(settings.max_image_checks)
        self._task: asyncio.Task[None] | None = None
        self.staged: list[CheckedImage] = []  # images sent for the next prompt
        self.used_ids: set[str] = set()  # every generation id this session has had
        # the id of the prompt (or regenerate) of each exchange the conversation holds, in
        # order; None where it is unknown (a state stored before they were kept)
        self.turn_ids: list[str | None] = []
        self.relay = Relay()  # to the connection's outbox; keeps what a resume needs
        self.send: Send = self.relay
        # while detached mid-reply: cancels the reply once --resume-grace-s is over (set by
        # disconnect; cancelled by resume, the reply's end and close)
        self._grace: asyncio.TimerHandle | None = None
        # while a reply goes on after a drop: done once it ends or a connection takes the
        # session back (web/admission.py keeps the address's connection place until then)
        self.held: asyncio.Future[None] | None = None
        self.address = "unknown"  # its connection's client address: whose fair share it uses
        self.listeners: list[RunListener] = []
        # called at each turn boundary (done, configure, reset, rewound, image_ok, a reply's
        # start): the store saves; ``progress`` as the running reply grows: the store
        # checkpoints it
        self.boundary: Callable[[Session], None] = _ignore
        self.progress: Callable[[Session], None] = _ignore
        # called once per rewind answered (False) and per regenerate accepted (True): the
        # server's counters (``ServerStats.count_rewind``)
        self.on_rewind: Callable[[bool], None] = _ignore_rewind

    RULES: ClassVar[dict[SessionState, dict[type[ClientFrame], Handler]]]

    @property
    def last_prompt(self) -> str | None:
        """The id of the prompt (or regenerate) of the conversation's last exchange."""
        return self.turn_ids[-1] if self.turn_ids else None

    async def handle(self, frame: ClientFrame) -> None:
        """Answer one frame as the table says for the current state."""
        await self.RULES[self.state][type(frame)](self, frame)

    @property
    def busy(self) -> bool:
        """A generation runs or waits for a slot."""
        return self.state in BUSY_STATES

    def _change(self, change: Change) -> None:
        new = TRANSITIONS[self.state].get(change)
        if new is None:
            raise SessionMisuse(f"session {self.state.value}: {change.value} is not allowed")
        if new is not self.state:
            log.debug("session %s: %s -> %s", self.key, self.state.value, new.value)
        self.state = new

    # -- frames --------------------------------------------------------------------------

    async def _on_ping(self, frame: Ping) -> None:
        await self.send(Pong(frame.t))

    async def _refuse_busy(self, frame: Prompt | Regenerate | Configure | Rewind) -> None:
        raise Busy(
            "a generation is already running in this session",
            id=frame.id if isinstance(frame, Prompt | Regenerate) else None,
        )

    async def _drop(self, frame: ClientFrame) -> None:
        """A closed session answers nothing: its connection is gone or closing."""
        log.debug("session %s: %s after close, dropped", self.key, type(frame).__name__)

    async def _on_configure(self, frame: Configure) -> None:
        if frame.params is not None:
            self.limits.check_params(frame.params)
        if frame.system is not None:
            # checked before it changes anything, and nothing after it can fail
            # (PROTOCOL.md "configure": a refused configure changes nothing)
            # a refusal (too large) goes to the error boundary as the engine raised it
            await self.chat.set_system(frame.system, min_turn_tokens=MIN_TURN_TOKENS)
            self.turn_ids.clear()  # the conversation starts afresh
        if frame.params is not None:
            self.defaults = frame.params.merged_over(self.defaults)
        await self.send(Configured())
        self.boundary(self)

    async def _cancel_run(self, frame: Cancel) -> None:
        assert self.run is not None  # QUEUED and RUNNING have one
        if frame.id in (None, self.run.id):
            self.run.cancel()
        else:
            await self._cancel_finished(frame)

    async def _cancel_finished(self, frame: Cancel) -> None:
        if frame.id is not None and frame.id not in self.used_ids:
            raise NotRunning(f"no generation {frame.id!r} in this session", id=frame.id)
        # PROTOCOL.md "cancel": silent for one that has already finished

    async def _on_reset(self, frame: Reset) -> None:
        await self.stop_generation()
        self.chat.reset()
        self.turn_ids.clear()
        self.staged.clear()
        await self.send(ResetOk())
        self.boundary(self)

    async def _on_image(self, frame: Image) -> None:
        rules = self.image_rules()
        rules.require(frame.id)
        rules.stage(len(self.staged), frame.id)
        (image,) = await self._check_images(rules, [frame.data], frame.id)
        self.staged.append(image)
        await self.send(ImageOk(frame.id, image.width, image.height))
        self.boundary(self)

    async def _on_rewind(self, frame: Rewind) -> None:
        held = self.chat.turns
        if frame.keep > held:
            raise InvalidParams(f"keep is {frame.keep}; the conversation holds {held} exchanges")
        self.chat.rewind(frame.keep)
        del self.turn_ids[frame.keep :]
        self.on_rewind(False)
        await self.send(Rewound(self.chat.turns))
        self.boundary(self)

    async def _on_regenerate(self, frame: Regenerate) -> None:
        self._check_unused(frame.id)
        if not self.chat.turns:
            raise InvalidParams("the conversation holds no exchange to regenerate", id=frame.id)
        merged = self._merged_params(frame)
        # a refusal (context overflow) goes to the error boundary as it is
        prepared = self.chat.prepare_regenerate(self.limits.sampling(merged))
        self._launch(frame.id, prepared, merged)
        self.on_rewind(True)

    def _check_unused(self, frame_id: str) -> None:
        if frame_id in self.used_ids:
            raise InvalidParams(f"id {frame_id!r} was already used in this session", id=frame_id)

    async def _on_prompt(self, frame: Prompt) -> None:
        self._check_unused(frame.id)
        if not frame.text and not frame.images and not self.staged:
            raise InvalidParams("a prompt needs text or images", id=frame.id)
        self.limits.check_text(frame.text, frame.id)
        merged = self._merged_params(frame)
        images = await self._prompt_images(frame)
        turn = Turn(frame.text, self.limits.sampling(merged), [i.image for i in images])
        # a refusal (too large, context overflow) goes to the error boundary as it is
        prepared = await self.chat.prepare(turn, max_user_tokens=self.settings.max_prompt_tokens)
        self._launch(frame.id, prepared, merged)
        self.staged.clear()

    def _launch(self, run_id: str, prepared: PreparedTurn, merged: GenerationParams) -> None:
        """Queue the run (``overloaded`` when the queue is full), its id used from now on."""
        ticket = self.slots.enqueue(self.address)
        self.used_ids.add(run_id)
        run = GenerationRun(
            run_id,
            prepared,
            ticket,
            bool(merged.token_ids),
            self.settings.stall_timeout_s,
            listeners=list(self.listeners),
        )
        self.relay.begin(run.id, run.sent)
        self.run = run
        self._change(Change.ACCEPTED)
        run.listeners.append(self._on_run_event)
        self._task = asyncio.create_task(self._drive(run))

    # -- generation lifecycle ------------------------------------------------------------

    def _on_run_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self._change(Change.STARTED)
            self.boundary(self)  # the running turn is kept, should this process die
        elif isinstance(event, TokensSent):
            self.progress(self)

    async def _drive(self, run: GenerationRun) -> None:
        try:
            await run.drive(self.chat, self.slots, self.send)
        finally:
            self.run = None
            self.last_active_at = time.monotonic()
            if run.kept:  # the chat holds its exchange: after the ones it was prompted after
                del self.turn_ids[run.prepared.history :]
                self.turn_ids.append(run.id)
            self._end_grace()
            self._change(Change.ENDED)
            self.boundary(self)

    @property
    def generation_task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop_generation(self) -> None:
        """Cancel whatever runs or waits and return once its ``done`` is sent."""
        run, task = self.run, self._task
        if run is None or task is None:
            return
        run.cancel()
        with contextlib.suppress(Exception):
            await asyncio.shield(task)

    async def close(self) -> None:
        """For good: the generation is stopped, later frames are dropped. Idempotent."""
        self._end_grace()
        await self.stop_generation()
        self._change(Change.CLOSE)

    # -- its connection ------------------------------------------------------------------

    async def disconnect(self, grace_s: float = 0.0) -> None:
        """The connection is gone. A reply in flight is cancelled (its ``done`` goes nowhere),
        or, given a ``grace_s`` (a drop mid-reply: PROTOCOL.md section 10), goes on without a
        connection for that long, its frames kept for ``resume``; then it is cancelled."""
        # a reply that has sent no token yet (queued, or before its first) has nothing to
        # resume: it is cancelled at once rather than hold a slot or a place in the queue
        started = self.run is not None and self.run.first_token_at is not None
        mid_reply = self.busy and grace_s > 0 and started
        # a drop: a resume is told how the reply ended even so (its done, without asking)
        self.relay.detach(self.busy and grace_s > 0)
        if not mid_reply:
            await self.stop_generation()
            return
        self._change(Change.DROPPED)
        self._grace = asyncio.get_running_loop().call_later(grace_s, self._grace_over)
        self.held = asyncio.get_running_loop().create_future()

    def _grace_over(self) -> None:
        self._grace = None
        if self.run is not None:
            log.info("session %s: nobody resumed within the grace period: cancelled", self.key)
            self.run.cancel()  # kept in the conversation as a cancelled exchange

    def _end_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self.held is not None and not self.held.done():
            self.held.set_result(None)

    def resume(self, last: int | None) -> CatchUp:
        """A connection took the session over: what it must send before any live frame (the
        reply's frames after token index ``last``). Then ``relay.attach`` its outbox."""
        self._end_grace()
        if self.state in DETACHED_STATES:
            self._change(Change.RESUMED)
        return self.relay.catch_up(last)

    # -- state, for a store that keeps it outside this process (snapshot.py) --------------

    def restore(
        self,
        defaults: GenerationParams,
        staged: list[CheckedImage],
        used_ids: set[str],
        turn_ids: list[str | None],
        kept: KeptReply | None,
    ) -> None:
        """What ``snapshot.import_state`` read back, its conversation in the chat already."""
        self.defaults, self.staged, self.used_ids = defaults, staged, used_ids
        self.turn_ids = turn_ids
        if kept is not None:
            self.relay.keep(kept)

    # -- helpers -------------------------------------------------------------------------

    def _merged_params(self, frame: Prompt | Regenerate) -> GenerationParams:
        """The prompt's params over the session's defaults (the server's fill the rest)."""
        return self.limits.merged(frame.params, self.defaults, frame.id)

    def image_rules(self) -> ImageRules:
        from .images import ImageRules  # Pillow loads only for image prompts

        return ImageRules.of(self.engine, self.settings, self.max_images)

    async def _prompt_images(self, frame: Prompt) -> list[CheckedImage]:
        if not frame.images:
            return list(self.staged)
        rules = self.image_rules()
        rules.require(frame.id)
        rules.count(len(self.staged) + len(frame.images), frame.id)
        return [*self.staged, *await self._check_images(rules, frame.images, frame.id)]

    async def _check_images(
        self, rules: ImageRules, blobs: Sequence[bytes], frame_id: str
    ) -> list[CheckedImage]:
        """The uploads checked, within the session's byte budget."""
        checked = await rules.check(blobs, self.image_checks, frame_id)
        rules.budget(self.held_images, checked, frame_id)
        return checked

    @property
    def held_images(self) -> list[object]:
        """The images this session keeps: its conversation's (with a running or queued
        prompt's) and the staged ones."""
        held = self.chat.images
        run = self.run
        # queued: the chat has not seen it (a regenerate's are the last exchange's own)
        if run is not None and run.generation is None and not run.prepared.replaces:
            held = [*held, *run.prepared.turn.images]
        return [*held, *(c.image for c in self.staged)]

    @property
    def image_bytes(self) -> int:
        from .images import image_bytes

        return sum(image_bytes(image) for image in self.held_images)


def _ignore(session: Session) -> None:
    return None


def _ignore_rewind(regenerate: bool) -> None:
    return None


# (state, frame type) -> handler: the session's rules, one row per state.
Session.RULES = {
    IDLE: {
        Prompt: Session._on_prompt,
        Image: Session._on_image,
        Cancel: Session._cancel_finished,
        Reset: Session._on_reset,
        Ping: Session._on_ping,
        Configure: Session._on_configure,
        Rewind: Session._on_rewind,
        Regenerate: Session._on_regenerate,
    },
    QUEUED: {
        Prompt: Session._refuse_busy,
        Image: Session._on_image,
        Cancel: Session._cancel_run,
        Reset: Session._on_reset,
        Ping: Session._on_ping,
        Configure: Session._refuse_busy,
        Rewind: Session._refuse_busy,
        Regenerate: Session._refuse_busy,
    },
    RUNNING: {
        Prompt: Session._refuse_busy,
        Image: Session._on_image,
        Cancel: Session._cancel_run,
        Reset: Session._on_reset,
        Ping: Session._on_ping,
        Configure: Session._refuse_busy,
        Rewind: Session._refuse_busy,
        Regenerate: Session._refuse_busy,
    },
    # no connection feeds a detached session: a resume moves it back to RUNNING first
    RUNNING_DETACHED: dict.fromkeys(CLIENT_FRAMES.values(), Session._drop),
    CLOSED: dict.fromkeys(CLIENT_FRAMES.values(), Session._drop),
}

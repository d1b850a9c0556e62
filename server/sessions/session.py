"""``Session``: one session as the server runs it: its core (core.py: the rules, no I/O), driven.

Every door drives it alike: ``handle`` feeds the core a client frame or an API request's whole
prompt, ``connect``/``attach``/``disconnect``/``close`` what becomes of its connection. Each
effect the core answers with (effects.py) is performed here, in order (a frame sent through the
relay to the outbox the door attached, a turn prepared (turns.py), a run started as a task
(generation.py), the grace timer set, the store told), and what it yields goes back to the core
as an input. A refusal, the core's or an effect's, leaves ``handle`` as it was raised, having
changed nothing: the door frames it (error_boundary.py). Its collaborators come at construction
from one factory (hub.py); no other module sets its attributes (tests/test_outside_writes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from wschat.protocol import Cancel

from ..engine import Chat, Engine
from ..settings import Settings
from .core import SessionCore
from .effects import (
    CancelRun,
    CheckImage,
    Checkpoint,
    CountRewind,
    Detach,
    Effect,
    EndGrace,
    LoadConversation,
    PrepareTurn,
    Save,
    SendFrame,
    SetGrace,
    SetSystem,
    StartRun,
    StopRun,
)
from .error_boundary import Send
from .events import RunEvent, RunListener, RunStarted, TokensSent
from .gates import Gate
from .generation import GenerationRun
from .grace import GraceTimer
from .hooks import EngineKeys, SessionHooks
from .inputs import (
    Close,
    ConversationLoaded,
    Dropped,
    GraceOver,
    ImageChecked,
    Input,
    RunBegan,
    RunEnded,
    RunGrew,
    SystemSet,
    TakenOver,
    TurnPrepared,
)
from .limits import MIN_TURN_TOKENS
from .relay import CatchUp, Relay
from .states import SessionState
from .turns import Preparing, check_staged, load_conversation, prepare

if TYPE_CHECKING:
    from .snapshot import Restored

RUN_BEGAN, RUN_GREW, GRACE_OVER, CLOSE = RunBegan(), RunGrew(), GraceOver(), Close()
CANCEL = Cancel(None)  # whatever runs or waits


class Session:
    def __init__(
        self,
        core: SessionCore,
        engine: Engine,
        settings: Settings,
        *,
        max_images: int,
        image_checks: Gate,
        listeners: Sequence[RunListener] = (),
        hooks: SessionHooks | None = None,
        keys: EngineKeys | None = None,
        outbox: Send | None = None,
    ) -> None:
        self.core = core
        self.engine = engine
        self.max_images = max_images  # per prompt: the server's and the model's
        # to the connection's outbox (``attach``); keeps what a resume needs
        self.relay = Relay(outbox)
        self._stall_timeout_s = settings.stall_timeout_s
        self._listeners = [*listeners, self._on_run_event]
        self._hooks = hooks or SessionHooks()
        self._keys = keys
        held = core.held_images
        self._preparing = Preparing(engine, core.chat, settings, max_images, image_checks, held)
        self._run: GenerationRun | None = None
        self._task: asyncio.Task[None] | None = None
        # while detached mid-reply: ``GraceOver`` in --resume-grace-s (the core sets and ends it)
        self._grace = GraceTimer(lambda: self._perform_now(GRACE_OVER))

    @property
    def key(self) -> str:
        return self.core.key

    @property
    def state(self) -> SessionState:
        return self.core.state

    @property
    def chat(self) -> Chat:
        return self.core.chat

    @property
    def held(self) -> asyncio.Future[None] | None:
        """While a reply goes on after a drop: done once it ends or the session is taken back."""
        return self._grace.held

    @property
    def run(self) -> GenerationRun | None:
        """The run of the prompt accepted, from its queue to its end."""
        return self._run

    @property
    def generation_task(self) -> asyncio.Task[None] | None:
        return self._task

    async def handle(self, event: Input) -> None:
        """Feed the core ``event`` (a client frame, an API request's whole prompt) and perform
        what it asks for; a refusal raises."""
        await self._perform(self.core.receive(event))

    def connect(
        self,
        drop: Callable[[], None] | None,
        taken_over: TakenOver | None = None,
        last: int | None = None,
    ) -> CatchUp | None:
        """A connection holds the session; ``drop`` drops it at once (for the next one to).
        ``taken_over``: by a resume, and the catch-up is returned, what the connection sends
        after ``ready`` and before any live frame (the reply's frames after token index
        ``last``; the connection before is dropped). Then it ``attach``es its outbox."""
        catch_up = None
        if taken_over is not None:
            self._perform_now(taken_over)
            catch_up = self.relay.catch_up(last)
        self.relay.connected(drop)
        return catch_up

    async def attach(self, outbox: Send) -> None:
        """What was held since the catch-up, then the session's frames as they come."""
        await self.relay.attach(outbox)

    async def disconnect(self, grace_s: float = 0.0) -> None:
        """The connection is gone: a reply in flight is cancelled, or given ``grace_s`` (a drop
        mid-reply: inputs.py ``Dropped``) goes on that long, its frames kept for a resume."""
        await self.handle(Dropped(grace_s))

    async def close(self) -> None:
        """For good: the generation is stopped, later inputs are dropped. Idempotent."""
        await self.handle(CLOSE)

    def cancel_run(self) -> None:
        """Cancel whatever runs or waits (its ``done`` comes as it ends), from a door that cannot
        await (a client gone): fed to the core as a ``cancel`` frame, its effect done at once."""
        self._perform_now(CANCEL)

    async def stop_generation(self) -> None:
        """Cancel whatever runs or waits and return once its ``done`` is sent."""
        run, task = self._run, self._task
        if run is None or task is None:
            return
        run.cancel()
        with contextlib.suppress(Exception):
            await asyncio.shield(task)

    def restore(self, saved: Restored) -> None:
        """What ``snapshot.import_state`` read back, its conversation in the chat already."""
        self.core.restore(saved)
        if saved.kept is not None:
            self.relay.keep(saved.kept)

    # -- performing the core's effects -----------------------------------------------------------

    async def _perform(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if (now := PERFORM_NOW.get(type(effect))) is not None:
                now(self, effect)
            else:
                await PERFORM[type(effect)](self, effect)

    def _perform_now(self, event: Input) -> None:
        """Feed ``event`` from a callback: what the core asks for then is done at once."""
        for effect in self.core.receive(event):
            PERFORM_NOW[type(effect)](self, effect)

    async def _send(self, effect: SendFrame) -> None:
        await self.relay(effect.frame)

    async def _set_system(self, effect: SetSystem) -> None:
        await self.chat.set_system(effect.frame.system, min_turn_tokens=MIN_TURN_TOKENS)
        await self.handle(SystemSet(effect))

    async def _check_image(self, effect: CheckImage) -> None:
        image = await check_staged(self._preparing, effect.frame, len(self.core.staged))
        await self.handle(ImageChecked(effect, image))

    async def _load(self, effect: LoadConversation) -> None:
        await load_conversation(self._preparing, effect.conversation)
        await self.handle(ConversationLoaded(effect))

    async def _prepare(self, effect: PrepareTurn) -> None:
        prepared = await prepare(self._preparing, effect)
        await self.handle(TurnPrepared(effect, prepared))

    async def _stop(self, effect: StopRun) -> None:
        await self.stop_generation()
        if effect.then is not None:
            await self.handle(effect.then)

    def _start(self, effect: StartRun) -> None:
        prepared = effect.prepared
        key = self._keys.acquire(prepared.prompt_ids) if self._keys is not None else None
        run = GenerationRun(
            effect.id,
            prepared,
            effect.ticket,
            effect.token_ids,
            self._stall_timeout_s,
            key=key,
            scope=effect.scope,
            listeners=list(self._listeners),
        )
        self.relay.begin(run.id, run.sent)
        self._run = run
        self._task = asyncio.create_task(self._drive(run))

    async def _drive(self, run: GenerationRun) -> None:
        try:
            await run.drive(self.chat, self.core.slots, self.relay)
        finally:
            self._run = None
            if self._keys is not None and run.key is not None:
                self._keys.release(run.key, run.kept_ids())
            self._perform_now(RunEnded(run.kept))

    def _on_run_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self._perform_now(RUN_BEGAN)
        elif isinstance(event, TokensSent):
            self._perform_now(RUN_GREW)

    def _cancel(self, effect: CancelRun) -> None:
        if self._run is not None:
            self._run.cancel()

    def _set_grace(self, effect: SetGrace) -> None:
        self._grace.start(effect.seconds)

    def _end_grace(self, effect: EndGrace) -> None:
        self._grace.end()

    def _detach(self, effect: Detach) -> None:
        self.relay.detach(effect.in_flight)

    def _save(self, effect: Save) -> None:
        self._hooks.boundary(self)

    def _checkpoint(self, effect: Checkpoint) -> None:
        self._hooks.progress(self)

    def _count_rewind(self, effect: CountRewind) -> None:
        self._hooks.on_rewind(effect.regenerate)


# effect type -> how it is performed: at once, or awaited (a send, a turn to prepare, a run to stop)
PERFORM_NOW: dict[type[Effect], Callable[[Session, Any], None]] = {
    StartRun: Session._start,
    CancelRun: Session._cancel,
    SetGrace: Session._set_grace,
    EndGrace: Session._end_grace,
    Detach: Session._detach,
    Save: Session._save,
    Checkpoint: Session._checkpoint,
    CountRewind: Session._count_rewind,
}
PERFORM: dict[type[Effect], Callable[[Session, Any], Awaitable[None]]] = {
    SendFrame: Session._send,
    SetSystem: Session._set_system,
    CheckImage: Session._check_image,
    LoadConversation: Session._load,
    PrepareTurn: Session._prepare,
    StopRun: Session._stop,
}

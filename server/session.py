"""``Session``: one connection's conversation, defaults and state machine.

    IDLE --prompt--> QUEUED --slot granted--> RUNNING --done--> IDLE
    any --close--> CLOSED

Frames are dispatched through a table; a frame that its state does not allow raises a typed
``ProtocolError`` (``busy``), which the connection turns into an ``error`` frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from wschat.protocol import (
    Cancel,
    ClientFrame,
    Configure,
    Configured,
    ErrorCode,
    FinishReason,
    Frame,
    GenerationParams,
    Image,
    ImageOk,
    InvalidParams,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Reset,
    ResetOk,
)

from .engine import Engine, GenerationRequest, SamplingParams
from .engine.history import Conversation
from .engine.tokenizing import TextTokenizer
from .run import GenerationRun
from .scheduler import GenerationSlots
from .settings import Settings

if TYPE_CHECKING:
    from .images import CheckedImage

log = logging.getLogger("wschat.session")

Send = Callable[[Frame], Awaitable[None]]

# PROTOCOL.md "configure": the context a system prompt must leave for the user's text and reply
MIN_TURN_TOKENS = 32


class SessionState(Enum):
    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    CLOSED = "closed"


_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.IDLE: frozenset({SessionState.QUEUED, SessionState.CLOSED}),
    SessionState.QUEUED: frozenset({SessionState.RUNNING, SessionState.IDLE, SessionState.CLOSED}),
    SessionState.RUNNING: frozenset({SessionState.IDLE, SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


def busy(frame_id: str | None = None) -> ProtocolError:
    return ProtocolError(
        "a generation is already running in this session", id=frame_id, code=ErrorCode.BUSY
    )


class Session:
    def __init__(
        self,
        key: str,
        engine: Engine,
        slots: GenerationSlots,
        settings: Settings,
        tokenizer: TextTokenizer | None = None,
    ) -> None:
        self.key = key
        self.engine = engine
        self.slots = slots
        self.settings = settings
        self.conversation = Conversation(engine.prompt_format)
        self.tokenizer = tokenizer or TextTokenizer()
        self.defaults = GenerationParams()
        self.state = SessionState.IDLE
        self.run: GenerationRun | None = None
        self.last_active_at = time.monotonic()  # when its last generation ended
        self.max_images = min(settings.max_images, engine.info.max_images)
        self._task: asyncio.Task[None] | None = None
        self._staged: list[CheckedImage] = []
        self._ids: set[str] = set()  # every generation id this session has had
        self.send: Send = _discard
        self.listeners: list[Callable[[GenerationRun, str, Any], None]] = []
        self._handlers: dict[type[Frame], Callable[[Any], Awaitable[None]]] = {
            Prompt: self._on_prompt,
            Image: self._on_image,
            Cancel: self._on_cancel,
            Reset: self._on_reset,
            Ping: self._on_ping,
            Configure: self._on_configure,
        }

    def _set_state(self, new: SessionState) -> None:
        if new is self.state:
            return
        if new not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal session transition {self.state.value} -> {new.value}")
        log.debug("session %s: %s -> %s", self.key, self.state.value, new.value)
        self.state = new

    async def handle(self, frame: ClientFrame) -> None:
        await self._handlers[type(frame)](frame)

    # -- frames --------------------------------------------------------------------------

    async def _on_ping(self, frame: Ping) -> None:
        await self.send(Pong(frame.t))

    async def _on_configure(self, frame: Configure) -> None:
        if self.run is not None:
            raise busy()
        if frame.params is not None:
            self._check_limits(frame.params)
        system_ids = await self._system_ids(frame.system) if frame.system else []
        # every check passed: nothing changed before this point (PROTOCOL.md "configure")
        if frame.params is not None:
            self.defaults = frame.params.merged_over(self.defaults)
        if frame.system is not None:
            self.conversation.set_system(frame.system, system_ids)
            self.engine.forget(self.key)
        await self.send(Configured())

    async def _system_ids(self, system: str) -> list[int]:
        """The system prompt's tokens; too_large when they leave no room for a turn, which no
        reset could ever make (PROTOCOL.md "configure")."""
        ids = await self.tokenizer.tokenize(self.conversation.tokenize_system, system)
        context = self.engine.info.context_tokens
        markup = self.conversation.first_turn_tokens(ids) - len(ids)
        longest = context - MIN_TURN_TOKENS - markup
        if len(ids) > longest:
            raise ProtocolError(
                f"the system prompt is {len(ids)} tokens; a context of {context} holds at most"
                f" {max(longest, 0)} with room for a turn",
                code=ErrorCode.TOO_LARGE,
            )
        return ids

    async def _on_cancel(self, frame: Cancel) -> None:
        run = self.run
        if run is not None and frame.id in (None, run.id):
            run.cancel()
        elif frame.id is not None and frame.id not in self._ids:
            raise ProtocolError(
                f"no generation {frame.id!r} in this session",
                id=frame.id,
                code=ErrorCode.NOT_RUNNING,
            )
        # PROTOCOL.md "cancel": silent for one that has already finished

    async def _on_reset(self, frame: Reset) -> None:
        await self.stop_generation()
        self.conversation.clear()
        self._staged.clear()
        self.engine.forget(self.key)
        await self.send(ResetOk())

    async def _on_image(self, frame: Image) -> None:
        self._require_images(frame.id)
        if len(self._staged) + 1 > self.max_images:
            raise ProtocolError(
                f"at most {self.max_images} images per prompt",
                id=frame.id,
                code=ErrorCode.TOO_LARGE,
            )
        (image,) = await self._check_images([frame.data], frame.id)
        self._staged.append(image)
        await self.send(ImageOk(frame.id, image.width, image.height))

    async def _on_prompt(self, frame: Prompt) -> None:
        if self.run is not None:
            raise busy(frame.id)
        if frame.id in self._ids:
            raise InvalidParams(f"id {frame.id!r} was already used in this session", id=frame.id)
        if not frame.text and not frame.images and not self._staged:
            raise InvalidParams("a prompt needs text or images", id=frame.id)
        if len(frame.text.encode()) > self.settings.max_prompt_bytes:
            raise ProtocolError(
                f"prompt text is over {self.settings.max_prompt_bytes} bytes",
                id=frame.id,
                code=ErrorCode.TOO_LARGE,
            )
        merged = self._merged_params(frame)
        images = await self._prompt_images(frame)
        user_ids = await self.tokenizer.tokenize(self.conversation.tokenize_user, frame.text)
        if len(user_ids) > self.settings.max_prompt_tokens:
            raise ProtocolError(
                f"prompt is over {self.settings.max_prompt_tokens} tokens",
                id=frame.id,
                code=ErrorCode.TOO_LARGE,
            )
        image_ids = [self._image_placeholder() for _ in images]
        prompt_ids = self.conversation.prompt_ids(user_ids, image_ids)
        context = self.engine.info.context_tokens
        if len(prompt_ids) >= context:
            fresh = self.conversation.prompt_ids(user_ids, image_ids, fresh=True)
            # advise a reset only where one makes room: never a loop of resets
            advice = "reset to start afresh" if len(fresh) < context else "shorten the prompt"
            raise ProtocolError(
                f"the conversation needs {len(prompt_ids)} tokens; the context holds {context}"
                f" ({advice})",
                id=frame.id,
                code=ErrorCode.CONTEXT_OVERFLOW,
            )
        ticket = self.slots.enqueue()
        self._ids.add(frame.id)
        self._staged.clear()
        all_images = [*self.conversation.images, *(i.image for i in images)]
        request = GenerationRequest(prompt_ids, self._sampling(merged), all_images, self.key)
        run = GenerationRun(
            frame.id,
            request,
            ticket,
            bool(merged.token_ids),
            self.settings.stall_timeout_s,
            listeners=list(self.listeners),
        )
        self.run = run
        self._set_state(SessionState.QUEUED)
        run.listeners.append(self._on_run_event)
        self._task = asyncio.create_task(self._drive(run, user_ids, image_ids, images))

    # -- generation lifecycle ------------------------------------------------------------

    def _on_run_event(self, run: GenerationRun, event: str, value: Any) -> None:
        if event == "start" and self.state is SessionState.QUEUED:
            self._set_state(SessionState.RUNNING)

    async def _drive(
        self,
        run: GenerationRun,
        user_ids: list[int],
        image_ids: list[list[int]],
        images: list[CheckedImage],
    ) -> None:
        try:
            await run.drive(self.engine, self.slots, self.send)
        finally:
            finished = run.finished
            if finished is not None and finished.reason is not FinishReason.ERROR:
                self.conversation.add_exchange(
                    user_ids, image_ids, [i.image for i in images], finished.completion_ids
                )
            if self.run is run:
                self.run = None
                self.last_active_at = time.monotonic()
                if self.state is not SessionState.CLOSED:
                    self._set_state(SessionState.IDLE)

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
        await self.stop_generation()
        self._set_state(SessionState.CLOSED)

    # -- helpers -------------------------------------------------------------------------

    def _check_limits(self, params: GenerationParams) -> None:
        limit = self.settings.max_new_tokens
        if params.max_new_tokens is not None and params.max_new_tokens > limit:
            raise InvalidParams(f"max_new_tokens must be at most {limit}")

    def _merged_params(self, frame: Prompt) -> GenerationParams:
        """The prompt's params over the session's defaults (the server's fill the rest)."""
        if frame.params is None:
            return self.defaults
        try:
            self._check_limits(frame.params)
        except InvalidParams as e:
            e.id = frame.id
            raise
        return frame.params.merged_over(self.defaults)

    def _sampling(self, p: GenerationParams) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=p.max_new_tokens or self.settings.default_max_new_tokens,
            temperature=0.0 if p.temperature is None else p.temperature,
            top_p=1.0 if p.top_p is None else p.top_p,
            top_k=p.top_k or 0,
            repetition_penalty=p.repetition_penalty or 1.0,
            stop=p.stop or (),
            seed=p.seed,
        )

    def _require_images(self, frame_id: str) -> None:
        if not self.engine.info.images:
            raise ProtocolError(
                f"the model {self.engine.info.model!r} does not read images",
                id=frame_id,
                code=ErrorCode.UNSUPPORTED,
            )

    async def _prompt_images(self, frame: Prompt) -> list[CheckedImage]:
        if not frame.images:
            return list(self._staged)
        self._require_images(frame.id)
        total = len(self._staged) + len(frame.images)
        if total > self.max_images:
            raise ProtocolError(
                f"{total} images; at most {self.max_images} per prompt",
                id=frame.id,
                code=ErrorCode.TOO_LARGE,
            )
        return [*self._staged, *await self._check_images(list(frame.images), frame.id)]

    async def _check_images(self, blobs: list[bytes], frame_id: str) -> list[CheckedImage]:
        """The images in the form the session keeps (the engine's ``prepare_image``), within
        the session's byte budget."""
        from .images import ImageLimits, check_image  # Pillow loads only for image prompts

        limits = ImageLimits(self.settings.max_image_bytes, self.settings.max_image_pixels)
        fit = getattr(self.engine, "prepare_image", None)
        try:
            checked = await asyncio.to_thread(lambda: [check_image(b, limits, fit) for b in blobs])
        except ProtocolError as e:
            e.id = frame_id
            raise
        self._check_image_budget(checked, frame_id)
        return checked

    @property
    def image_bytes(self) -> int:
        """What the images this session keeps hold: its conversation's (with a running
        prompt's) and the staged ones."""
        from .images import image_bytes

        held = self.run.request.images if self.run is not None else self.conversation.images
        return sum(image_bytes(i) for i in [*held, *(c.image for c in self._staged)])

    def _check_image_budget(self, new: list[CheckedImage], frame_id: str) -> None:
        from .images import image_bytes

        held = self.image_bytes + sum(image_bytes(c.image) for c in new)
        limit = self.settings.max_session_image_bytes
        if held > limit:
            raise ProtocolError(
                f"this session's images would hold {held} bytes; max_session_image_bytes is"
                f" {limit} (reset to start afresh)",
                id=frame_id,
                code=ErrorCode.TOO_LARGE,
            )

    def _image_placeholder(self) -> list[int]:
        placeholder = getattr(self.engine, "image_placeholder_ids", None)
        if placeholder is None:
            raise ProtocolError("this engine does not read images", code=ErrorCode.UNSUPPORTED)
        return list(placeholder())


async def _discard(frame: Frame) -> None:
    return None

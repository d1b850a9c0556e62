"""A stateful test of ``Session``: any sequence of frames keeps the generation invariants.

Hypothesis drives one in-process session (``ScriptedEngine``, real ``GenerationSlots``) through
prompt / cancel / reset / ping / configure / image, interleaved with letting the event loop run
and with other "sessions" taking the only generation slot. After every step the whole frame log
is checked (frame_log.py): at most one generation open at a time, at most one ``start`` and one
``done`` per id (exactly one ``done`` per accepted prompt at the end), no frame of a generation
after its ``done``, ``concat(tokens) == done.text`` and the text its script implies, ``busy``
exactly when a generation runs or waits, and every other answer with its exact code. Errors are
recorded the way ``Connection`` sends them (``error_frame``). It runs twice: against a text-only
engine (images are ``unsupported``) and against one that reads images (staging up to
``MAX_IMAGES``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from wschat.protocol import (
    Cancel,
    ClientFrame,
    Configure,
    Configured,
    Done,
    Error,
    ErrorCode,
    Frame,
    GenerationParams,
    Image,
    ImageOk,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Reset,
    ResetOk,
)
from wschat.server.engine.base import GenerationRequest
from wschat.server.engine.errors import EngineError
from wschat.server.sessions.error_boundary import error_frame
from wschat.server.sessions.hooks import SessionHooks
from wschat.server.sessions.hub import Hub
from wschat.server.sessions.slots import Ticket
from wschat.server.settings import Settings

from tests.fakes.scripted import Script, ScriptedEngine
from tests.protocol.vector_cases import PNG_1X1
from tests.sessions.frame_log import check_log

TIMEOUT = 10.0
MAX_NEW_TOKENS = 16
MAX_IMAGES = 2

scripts = st.builds(
    Script,
    tokens=st.lists(st.sampled_from([" w", "\u00e9", "\U0001f600", "\u4f60", "ab"]), max_size=6),
    delay_s=st.sampled_from([0.0, 0.001]),
    fail_after=st.none() | st.integers(0, 6),
    end_with_eos=st.booleans(),
)


def error_keys(frames: list[Frame]) -> list[tuple[ErrorCode, str | None] | Frame]:
    """Each frame as (code, id) where it is an error, else as itself."""
    return [(f.code, f.id) if isinstance(f, Error) else f for f in frames]


class SessionMachine(RuleBasedStateMachine):
    """Against a text-only engine: images are ``unsupported``."""

    VISION = False

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.frames: list[Frame] = []
        self.changed = asyncio.Event()
        self.plan: list[Script] = []
        self.scripts_used: list[Script] = []  # in engine.start order, i.e. in Start order
        self.engine = ScriptedEngine(self._script, images=self.VISION, max_images=MAX_IMAGES)
        settings = Settings(max_new_tokens=MAX_NEW_TOKENS, max_concurrent=1, max_queue=1)
        hub = Hub(settings, self.engine)
        self.slots = hub.slots
        self.session = hub.new_session("s", outbox=self._record, hooks=SessionHooks())
        # Slots held or awaited by "other sessions", one entry per attempt (None: refused, as
        # timing decided), so that the preconditions below count only what the rules chose.
        self.hogs: list[Ticket | None] = []
        self.accepted: list[str] = []  # ids of accepted prompts, in order
        self.refused: set[str] = set()
        self.cancelled: set[str] = set()  # generations a cancel or reset was aimed at
        self.counter = 0
        self.staged = 0  # images staged for the next prompt

    # -- plumbing ----------------------------------------------------------------------------

    def _script(self, request: GenerationRequest) -> Script:
        script = self.plan[len(self.scripts_used) % len(self.plan)]
        self.scripts_used.append(script)
        return script

    async def _record(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.changed.set()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))

    def send(self, make: Callable[[], tuple[ClientFrame, Any]]) -> tuple[Any, list[Frame]]:
        """Handle the frame ``make`` builds, as ``Connection`` does; returns what ``make``
        expected and the frames the call caused.

        ``make`` runs in the same task step as ``Session.handle`` begins, so what it reads of
        this model (is a generation active?) is what the session sees: a generation cannot
        finish in between.
        """

        async def handle() -> tuple[Any, list[Frame]]:
            frame, expected = make()
            start = len(self.frames)
            try:
                await self.session.handle(frame)
            except (ProtocolError, EngineError) as e:  # what Connection answers with a frame
                await self._record(error_frame(e, getattr(frame, "id", None)))
            return expected, self.frames[start:]

        return self.run(handle())  # type: ignore[no-any-return]

    def done_ids(self) -> set[str]:
        return {f.id for f in self.frames if isinstance(f, Done)}

    @property
    def active(self) -> str | None:
        """The accepted generation whose ``done`` has not been sent: it runs or waits."""
        if self.accepted and self.accepted[-1] not in self.done_ids():
            return self.accepted[-1]
        return None

    def queue_full(self) -> bool:
        s = self.slots
        return s.running >= s.max_concurrent and s.queued >= s.max_queue

    def fresh_id(self) -> str:
        self.counter += 1
        return f"g{self.counter}"

    # -- rules -------------------------------------------------------------------------------

    @initialize(plan=st.lists(scripts, min_size=1, max_size=4))
    def set_plan(self, plan: list[Script]) -> None:
        self.plan = plan

    @rule()
    def prompt(self) -> None:
        self.prompt_with_a_flaw(None)

    @rule(flaw=st.sampled_from(["reuse", "empty", "image", "too_many_tokens"]))
    def prompt_with_a_flaw(self, flaw: str | None) -> None:
        old = sorted({*self.accepted, *self.refused})
        gen_id = old[self.counter % len(old)] if flaw == "reuse" and old else self.fresh_id()
        text = "" if flaw == "empty" else "\U0001f600 hi"
        images = (PNG_1X1,) if flaw == "image" else ()
        too_many_tokens = flaw == "too_many_tokens"
        params = GenerationParams(max_new_tokens=MAX_NEW_TOKENS + 1) if too_many_tokens else None

        def make() -> tuple[Prompt, ErrorCode | None]:
            if self.active is not None:
                expected: ErrorCode | None = ErrorCode.BUSY
            elif (
                gen_id in self.accepted
                or too_many_tokens
                or (not text and not images and not self.staged)
            ):
                expected = ErrorCode.INVALID_PARAMS
            elif images and not self.VISION:
                expected = ErrorCode.UNSUPPORTED
            elif self.staged + len(images) > MAX_IMAGES:
                expected = ErrorCode.TOO_LARGE
            elif self.queue_full():
                expected = ErrorCode.OVERLOADED
            else:
                expected = None
            return Prompt(gen_id, text, images, params), expected

        expected, caused = self.send(make)
        if expected is None:
            assert caused == []
            self.accepted.append(gen_id)
            self.staged = 0
        else:
            assert error_keys(caused) == [(expected, gen_id)]
            if gen_id not in self.accepted:
                self.refused.add(gen_id)

    @rule(aim=st.sampled_from(["none", "active", "finished", "refused", "unknown"]))
    def cancel(self, aim: str) -> None:
        def make() -> tuple[Cancel, str | None]:
            active = self.active
            finished = [i for i in self.accepted if i != active]
            choices = {
                "none": None,
                "active": active,
                "finished": finished[-1] if finished else None,
                "refused": min(self.refused - set(self.accepted), default=None),
                "unknown": "never-sent",
            }
            gen_id = choices[aim]
            if active is not None and gen_id in (None, active):
                self.cancelled.add(active)
            return Cancel(gen_id), gen_id

        gen_id, caused = self.send(make)
        if gen_id is None or gen_id in self.accepted:
            assert caused == []  # PROTOCOL.md "cancel": silent unless the id is unknown
        else:
            assert error_keys(caused) == [(ErrorCode.NOT_RUNNING, gen_id)]

    @rule()
    def reset(self) -> None:
        def make() -> tuple[Reset, str | None]:
            if self.active is not None:
                self.cancelled.add(self.active)
            return Reset(), self.active

        active, caused = self.send(make)
        assert isinstance(caused[-1], ResetOk)
        assert not any(isinstance(f, ResetOk) for f in caused[:-1])
        assert active is None or active in self.done_ids()  # its done came before reset_ok
        assert self.session.chat.turns == 0
        self.staged = 0

    @rule(t=st.none() | st.integers() | st.text(max_size=5) | st.just(Ping().t))
    def ping(self, t: Any) -> None:
        _, caused = self.send(lambda: (Ping(t), None))
        assert caused == [Pong(t)]

    @rule(system=st.none() | st.sampled_from(["", "be brief"]), over_limit=st.booleans())
    def configure(self, system: str | None, over_limit: bool) -> None:
        params = GenerationParams(max_new_tokens=MAX_NEW_TOKENS + over_limit, temperature=0.5)

        def make() -> tuple[Configure, ErrorCode | None]:
            if self.active is not None:
                return Configure(system, params), ErrorCode.BUSY
            return Configure(system, params), ErrorCode.INVALID_PARAMS if over_limit else None

        expected, caused = self.send(make)
        if expected is None:
            assert caused == [Configured()]
        else:
            assert error_keys(caused) == [(expected, None)]

    @rule(mime=st.sampled_from(["image/png", None]))
    def image(self, mime: str | None) -> None:
        def make() -> tuple[Image, ErrorCode | None]:
            if not self.VISION:
                return Image("img", PNG_1X1, mime), ErrorCode.UNSUPPORTED
            return Image("img", PNG_1X1, mime), (
                ErrorCode.TOO_LARGE if self.staged >= MAX_IMAGES else None
            )

        expected, caused = self.send(make)
        # the image is checked in a worker thread: a running generation's frames may come meanwhile
        answers = [f for f in caused if isinstance(f, ImageOk | Error) and f.id == "img"]
        if expected is None:
            assert answers == [ImageOk("img", 1, 1)]
            self.staged += 1
        else:
            assert [(f.code, f.id) for f in answers if isinstance(f, Error)] == [(expected, "img")]
            assert len(answers) == 1

    @rule(turns=st.integers(1, 5))
    def let_the_loop_run(self, turns: int) -> None:
        async def spin() -> None:
            for _ in range(turns):
                await asyncio.sleep(0)

        self.run(spin())

    # Preconditions read only what the rules decided, never what timing did, so that
    # hypothesis sees the same choices when it replays a sequence.

    @rule()
    def wait_for_done(self) -> None:
        """Other sessions finish first (else ours might wait for ever), then ours."""
        while self.hogs:
            self._release_hog()
        self.run(self._until_done(self.active))

    async def _until_done(self, gen_id: str | None) -> None:
        while gen_id is not None and gen_id not in self.done_ids():
            self.changed.clear()
            await self.changed.wait()

    @precondition(lambda self: len(self.hogs) < 2)
    @rule()
    def slot_taken_by_another_session(self) -> None:
        async def take() -> Ticket | None:
            full = self.queue_full()
            try:
                # another session of the same address: first come, first served between them
                ticket = self.slots.enqueue(self.session.core.address)
            except ProtocolError as e:
                assert full and e.code is ErrorCode.OVERLOADED
                return None
            assert not full
            return ticket

        self.hogs.append(self.run(take()))

    @precondition(lambda self: bool(self.hogs))
    @rule()
    def slot_freed_by_another_session(self) -> None:
        self._release_hog()

    def _release_hog(self) -> None:
        ticket = self.hogs.pop(0)
        if ticket is not None:
            self.slots.release(ticket)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def at_most_one_generation_uses_a_slot(self) -> None:
        assert self.slots.running <= 1
        assert (self.session.run is None) == (self.active is None)
        assert self.session.core.busy == (self.active is not None)

    @invariant()
    def frame_log_keeps_the_generation_contract(self) -> None:
        check_log(self.frames, self.scripts_used, self.cancelled, final=False)

    def teardown(self) -> None:
        try:
            while self.hogs:
                self._release_hog()
            self.run(self._until_done(self.active))
            check_log(self.frames, self.scripts_used, self.cancelled, final=True)
            assert Counter(f.id for f in self.frames if isinstance(f, Done)) == Counter(
                self.accepted
            )
            self.run(self.session.close())
            self.run(self.engine.aclose())
            assert self.engine.threads == set() and self.slots.running == 0
        finally:
            self.loop.close()


class VisionSessionMachine(SessionMachine):
    """Against an engine that reads images: ``image`` stages up to ``MAX_IMAGES`` of them."""

    VISION = True


MACHINE_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SessionMachine.TestCase.settings = MACHINE_SETTINGS
VisionSessionMachine.TestCase.settings = MACHINE_SETTINGS
test_text_session_keeps_generation_invariants_under_any_frame_sequence = SessionMachine.TestCase
test_vision_session_keeps_generation_invariants_under_any_frame_sequence = (
    VisionSessionMachine.TestCase
)

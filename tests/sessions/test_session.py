"""Session behaviour against the scripted engine, in-process: no socket, exact frames."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from wschat.protocol import (
    Cancel,
    Configure,
    Configured,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    Frame,
    GenerationParams,
    Ping,
    Pong,
    Prompt,
    ProtocolError,
    Queued,
    Reset,
    ResetOk,
    Start,
    Token,
)
from wschat.server.engine import ConversationTooLong, PromptTooLong
from wschat.server.sessions.error_boundary import error_frame
from wschat.server.sessions.hooks import SessionHooks
from wschat.server.sessions.hub import Hub
from wschat.server.sessions.images import image_bytes
from wschat.server.sessions.inputs import TakenOver
from wschat.server.sessions.session import Session
from wschat.server.sessions.snapshot import (
    export_state,
    import_state,
    pack,
    reply_checkpoint,
    unpack,
)
from wschat.server.sessions.states import SessionState
from wschat.server.settings import Settings

from tests.fakes.scripted import Script, ScriptedEngine

TIMEOUT = 10


class Recorder:
    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self._changed = asyncio.Condition()

    async def __call__(self, frame: Frame) -> None:
        async with self._changed:
            self.frames.append(frame)
            self._changed.notify_all()

    async def wait_for(self, predicate: Any) -> Frame:
        async with asyncio.timeout(TIMEOUT), self._changed:
            while True:
                for frame in self.frames:
                    if predicate(frame):
                        return frame
                await self._changed.wait()

    def of(self, kind: type[Frame], gen_id: str | None = None) -> list[Any]:
        return [
            f
            for f in self.frames
            if isinstance(f, kind) and (gen_id is None or getattr(f, "id", None) == gen_id)
        ]


def session_hub(engine: ScriptedEngine, **settings: Any) -> Hub:
    """A hub on ``engine`` (one slot, a queue of four unless ``settings`` say otherwise)."""
    return Hub(Settings(**{"max_concurrent": 1, "max_queue": 4, **settings}), engine)


def make_session(
    engine: ScriptedEngine,
    hub: Hub | None = None,
    hooks: SessionHooks | None = None,
    **settings: Any,
) -> tuple[Session, Recorder]:
    """A session of ``hub``'s making (a hub of its own with ``settings`` if none), its frames to
    the recorder."""
    recorder = Recorder()
    hub = hub or session_hub(engine, **settings)
    return hub.new_session("s1", outbox=recorder, hooks=hooks or SessionHooks()), recorder


def image_bytes_of(session: Session) -> int:
    """What the images the session keeps hold."""
    return sum(image_bytes(image) for image in session.core.held_images())


def slow(n: int = 50, delay: float = 0.02) -> ScriptedEngine:
    return ScriptedEngine(lambda req: Script([f" t{i}" for i in range(n)], delay_s=delay))


async def done_of(rec: Recorder, gen_id: str) -> Done:
    return await rec.wait_for(lambda f: isinstance(f, Done) and f.id == gen_id)  # type: ignore[return-value]


async def test_prompt_streams_tokens_then_one_done_with_their_text() -> None:
    session, rec = make_session(ScriptedEngine())
    await session.handle(Prompt("a", "hello"))
    done = await done_of(rec, "a")
    tokens = rec.of(Token, "a")
    assert "".join(t.text for t in tokens) == done.text == "".join(f" w{i}" for i in range(8))
    assert next(type(f) for f in rec.frames) is Start
    assert done.reason is FinishReason.STOP
    assert len(rec.of(Done)) == 1
    assert session.state is SessionState.IDLE


async def test_second_prompt_while_running_is_busy_and_changes_nothing() -> None:
    session, rec = make_session(slow())
    await session.handle(Prompt("a", "one"))
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Prompt("b", "two"))
    assert raised.value.code is ErrorCode.BUSY and raised.value.id == "b"
    await session.handle(Cancel("a"))
    done = await done_of(rec, "a")
    assert done.reason is FinishReason.CANCELLED
    assert rec.of(Start, "b") == []


async def test_cancel_mid_generation_sends_one_done() -> None:
    session, rec = make_session(slow())
    await session.handle(Prompt("a", "one"))
    await rec.wait_for(lambda f: isinstance(f, Token))
    await session.handle(Cancel())
    done = await done_of(rec, "a")
    await asyncio.sleep(0)  # let any stray frame land before counting
    assert done.reason is FinishReason.CANCELLED
    assert len(rec.of(Done, "a")) == 1
    assert done.usage.completion_tokens < 50
    assert rec.frames.index(done) == len(rec.frames) - 1


async def test_cancel_of_finished_id_is_silent_and_unknown_id_is_not_running() -> None:
    session, rec = make_session(ScriptedEngine())
    await session.handle(Prompt("a", "one"))
    await done_of(rec, "a")
    count = len(rec.frames)
    await session.handle(Cancel("a"))
    assert len(rec.frames) == count
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Cancel("nope"))
    assert raised.value.code is ErrorCode.NOT_RUNNING and raised.value.id == "nope"


async def test_reset_mid_generation_sends_done_then_reset_ok_and_clears_history() -> None:
    engine = slow()
    session, rec = make_session(engine)
    await session.handle(Prompt("a", "one"))
    await rec.wait_for(lambda f: isinstance(f, Token))
    await session.handle(Reset())
    kinds = [type(f) for f in rec.frames]
    assert kinds.index(Done) < kinds.index(ResetOk)
    assert session.chat.turns == 0
    assert engine.forgotten == ["s1"]


async def test_reused_id_is_invalid_params() -> None:
    session, rec = make_session(ScriptedEngine())
    await session.handle(Prompt("a", "one"))
    await done_of(rec, "a")
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Prompt("a", "again"))
    assert raised.value.code is ErrorCode.INVALID_PARAMS


async def test_empty_prompt_is_invalid_params() -> None:
    session, _ = make_session(ScriptedEngine())
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Prompt("a", ""))
    assert raised.value.code is ErrorCode.INVALID_PARAMS


async def test_max_new_tokens_over_the_server_limit_is_invalid_params() -> None:
    session, _ = make_session(ScriptedEngine(), max_new_tokens=16)
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Prompt("a", "x", params=GenerationParams(max_new_tokens=17)))
    assert raised.value.code is ErrorCode.INVALID_PARAMS
    assert raised.value.message == "max_new_tokens must be at most 16"


async def test_prompt_over_context_is_context_overflow_before_model_work() -> None:
    engine = ScriptedEngine(context_tokens=64)
    session, _ = make_session(engine)
    with pytest.raises(ConversationTooLong) as raised:
        await session.handle(Prompt("a", "x" * 100))
    assert error_frame(raised.value, "a").code is ErrorCode.CONTEXT_OVERFLOW
    assert engine.requests == []


async def test_queued_sessions_learn_their_position_and_start_in_order() -> None:
    engine = slow(n=5, delay=0.02)
    hub = session_hub(engine)
    sessions = [make_session(engine, hub) for _ in range(3)]
    for i, (session, _) in enumerate(sessions):
        await session.handle(Prompt(f"p{i}", "go"))
    await sessions[1][1].wait_for(lambda f: isinstance(f, Queued))
    await sessions[2][1].wait_for(lambda f: isinstance(f, Queued))
    assert [q.position for q in sessions[1][1].of(Queued)] == [1]
    assert next(q.position for q in sessions[2][1].of(Queued)) == 2
    for i, (_, rec) in enumerate(sessions):
        await done_of(rec, f"p{i}")
    assert [q.position for q in sessions[2][1].of(Queued)] == [2, 1]
    assert hub.slots.running == 0


async def test_full_queue_is_overloaded() -> None:
    engine = slow()
    hub = session_hub(engine, max_queue=1)
    (s1, _r1), (s2, _), (s3, _) = (make_session(engine, hub) for _ in range(3))
    await s1.handle(Prompt("a", "x"))
    await s2.handle(Prompt("b", "x"))
    with pytest.raises(ProtocolError) as raised:
        await s3.handle(Prompt("c", "x"))
    assert raised.value.code is ErrorCode.OVERLOADED
    await s1.close()
    await s2.close()


async def test_cancel_while_queued_gives_done_without_start() -> None:
    engine = slow()
    hub = session_hub(engine)
    (s1, _), (s2, r2) = make_session(engine, hub), make_session(engine, hub)
    await s1.handle(Prompt("a", "x"))
    await s2.handle(Prompt("b", "x"))
    await s2.handle(Cancel("b"))
    done = await done_of(r2, "b")
    assert done.reason is FinishReason.CANCELLED and r2.of(Start) == []
    assert hub.slots.queued == 0
    await s1.close()


async def test_engine_exception_becomes_error_then_done_error() -> None:
    engine = ScriptedEngine(lambda req: Script([" a", " b", " c"], fail_after=1))
    session, rec = make_session(engine)
    await session.handle(Prompt("a", "x"))
    done = await done_of(rec, "a")
    errors = [f for f in rec.frames if isinstance(f, Error)]
    assert done.reason is FinishReason.ERROR and done.text == " a"
    assert [(e.code, e.id, e.message) for e in errors] == [
        (ErrorCode.INTERNAL, "a", "generation failed")
    ]


async def test_stalled_generation_is_cancelled_with_error() -> None:
    engine = ScriptedEngine(lambda req: Script([" a", " b"], stall_after=1))
    session, rec = make_session(engine, stall_timeout_s=0.3)
    await session.handle(Prompt("a", "x"))
    done = await done_of(rec, "a")
    engine.unstall()
    errors = [f for f in rec.frames if isinstance(f, Error)]
    assert done.reason is FinishReason.ERROR
    assert errors[0].message == "generation made no progress and was stopped"
    await engine.aclose()


async def test_configure_sets_defaults_and_system_and_ping_echoes() -> None:
    engine = ScriptedEngine()
    session, rec = make_session(engine)
    await session.handle(Configure(system="be brief", params=GenerationParams(max_new_tokens=3)))
    await session.handle(Ping(t=7))
    assert rec.of(Configured) and rec.of(Pong)[0].t == 7
    await session.handle(Prompt("a", "x"))
    done = await done_of(rec, "a")
    assert done.usage.completion_tokens == 3 and done.reason is FinishReason.LENGTH
    assert engine.requests[0].params.max_new_tokens == 3


async def test_second_turn_prompt_extends_the_first_token_for_token() -> None:
    engine = ScriptedEngine()
    session, rec = make_session(engine)
    await session.handle(Prompt("a", "one"))
    await done_of(rec, "a")
    await session.handle(Prompt("b", "two"))
    await done_of(rec, "b")
    first, second = engine.requests
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids


# PROTOCOL.md "configure": with context 128, the scripted engine's first turn takes 18 tokens of
# markup around the system prompt, and 32 must be left for the user's text and the reply.
LONGEST_SYSTEM = 128 - 18 - 32


async def test_a_system_prompt_leaving_no_room_for_a_turn_is_too_large_and_changes_nothing() -> (
    None
):
    session, rec = make_session(ScriptedEngine(context_tokens=128))
    await session.handle(Configure(system="be brief", params=GenerationParams(max_new_tokens=3)))
    await session.handle(Prompt("a", "hi"))
    await done_of(rec, "a")
    with pytest.raises(PromptTooLong) as raised:  # the error boundary gives it its code
        too_long = Configure(system="s" * (LONGEST_SYSTEM + 1), params=GenerationParams(seed=1))
        await session.handle(too_long)
    assert error_frame(raised.value) == Error(
        ErrorCode.TOO_LARGE,
        "the system prompt is 79 tokens; a context of 128 holds at most 78 with room for a turn",
    )
    assert session.chat.system == "be brief"
    assert session.chat.turns == 1
    assert session.core.defaults == GenerationParams(max_new_tokens=3)


async def test_the_longest_system_prompt_accepted_leaves_room_for_a_short_turn() -> None:
    engine = ScriptedEngine(context_tokens=128)
    session, rec = make_session(engine)
    await session.handle(Configure(system="s" * LONGEST_SYSTEM))
    assert rec.of(Configured)
    await session.handle(Prompt("a", "x" * 31))
    assert (await done_of(rec, "a")).reason is not FinishReason.ERROR
    assert len(engine.requests[0].prompt_ids) == 127


async def test_context_overflow_advises_reset_only_when_a_reset_would_make_room() -> None:
    session, rec = make_session(ScriptedEngine(context_tokens=128))
    with pytest.raises(ConversationTooLong) as alone:  # the error boundary gives it its code
        await session.handle(Prompt("a", "x" * 120))
    assert error_frame(alone.value, "a").code is ErrorCode.CONTEXT_OVERFLOW
    assert "reset" not in alone.value.message
    await session.handle(Prompt("b", "x" * 60))
    await done_of(rec, "b")
    with pytest.raises(ConversationTooLong) as after_a_turn:
        await session.handle(Prompt("c", "x" * 60))
    assert "reset" in after_a_turn.value.message
    await session.handle(Reset())
    await session.handle(Prompt("c", "x" * 60))
    assert (await done_of(rec, "c")).reason is not FinishReason.ERROR


async def test_a_running_turn_exported_mid_reply_comes_back_as_a_cancelled_exchange() -> None:
    """What a replica that died mid-reply leaves: the state with its running turn and the
    reply's checkpoint; the session rebuilt from them holds the turn as a cancelled exchange."""
    session, rec = make_session(slow())
    await session.handle(Prompt("a", "one"))
    await rec.wait_for(lambda f: isinstance(f, Token) and f.index >= 2)
    state, partial = unpack(pack(export_state(session))), reply_checkpoint(session)
    await session.close()
    assert partial is not None and partial["id"] == "a" and len(partial["ids"]) >= 2
    rebuilt, _ = make_session(ScriptedEngine())
    import_state(rebuilt, state, partial)
    last = rebuilt.chat.export_state()["exchanges"][-1]
    assert (rebuilt.chat.turns, rebuilt.core.last_prompt) == (1, "a")
    assert last["reply"] == partial["ids"]
    elsewhere, _ = make_session(ScriptedEngine())
    import_state(elsewhere, state, {"id": "another", "ids": [1, 2]})  # not this turn's
    assert elsewhere.chat.export_state()["exchanges"][-1]["reply"] == []


# -- its connection ----------------------------------------------------------------------------


async def test_a_drop_mid_reply_then_a_resume_catch_the_reply_up_and_it_goes_on() -> None:
    session, rec = make_session(slow(200))
    await session.handle(Prompt("g", "hello"))
    await rec.wait_for(lambda f: isinstance(f, Token))  # something to resume
    await session.disconnect(grace_s=60)  # dropped: the reply goes on
    held = session.held
    assert session.state is SessionState.RUNNING_DETACHED and held is not None
    catch_up = session.connect(None, TakenOver("b", "owner"), 0)
    assert session.state is SessionState.RUNNING and held.done()
    assert catch_up is not None and catch_up.reply == "g"
    assert isinstance(catch_up.frames[0], Token)
    assert (session.core.address, session.core.scope) == ("b", "owner")
    await session.close()


@pytest.mark.parametrize("state", [SessionState.QUEUED, SessionState.RUNNING])
async def test_a_drop_before_the_first_token_ends_the_reply_and_leaves_the_session_idle(
    state: SessionState,
) -> None:
    engine = slow(delay=1.0)  # RUNNING is entered at its start, a second before any token
    hub = session_hub(engine)
    hog = hub.slots.enqueue() if state is SessionState.QUEUED else None
    session, rec = make_session(engine, hub)
    await session.handle(Prompt("g", "hello"))
    if state is SessionState.RUNNING:
        await rec.wait_for(lambda f: isinstance(f, Start))
    assert session.state is state
    await session.disconnect(grace_s=60)
    assert session.state is SessionState.IDLE and session.run is None
    assert session.held is None  # nothing keeps its connection's place
    catch_up = session.connect(None, TakenOver("a", ""))  # a drop: the resume is told its end
    assert catch_up is not None and catch_up.reply == "g" and isinstance(catch_up.frames[-1], Done)
    if hog is not None:
        hub.slots.release(hog)


async def test_a_drop_with_no_grace_ends_the_reply_and_leaves_nothing_to_resume() -> None:
    session, rec = make_session(slow())
    await session.handle(Prompt("g", "hello"))
    await rec.wait_for(lambda f: isinstance(f, Token))
    await session.disconnect(grace_s=0.0)
    assert session.state is SessionState.IDLE and session.run is None
    catch_up = session.connect(None, TakenOver("a", ""))
    assert catch_up is not None and catch_up.reply is None

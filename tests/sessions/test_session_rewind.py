"""``rewind`` and ``regenerate`` (PROTOCOL.md section 5) against the scripted engine, in-process:
what each keeps and drops of the conversation, ``done.turn``, every refusal in its order, and
the exchange ids a stored session keeps."""

from __future__ import annotations

from typing import Any

import pytest
from wschat.protocol import (
    Cancel,
    Configure,
    Done,
    ErrorCode,
    FinishReason,
    GenerationParams,
    Image,
    ImageOk,
    Prompt,
    ProtocolError,
    Regenerate,
    Rewind,
    Rewound,
    Start,
    Token,
)
from wschat.server.engine import ConversationTooLong
from wschat.server.sessions.error_boundary import error_frame
from wschat.server.sessions.hooks import SessionHooks
from wschat.server.sessions.session import Session
from wschat.server.sessions.snapshot import (
    export_state,
    import_state,
    pack,
    reply_checkpoint,
    unpack,
)
from wschat.server.sessions.states import SessionState

from tests.fakes.scripted import Script, ScriptedEngine
from tests.protocol.vector_cases import PNG_1X1
from tests.support import RawPeer, raw_peer, running_server

from .test_session import Recorder, done_of, image_bytes_of, make_session, session_hub, slow


async def turns(session: Session, rec: Recorder, *texts: str, prefix: str = "p") -> list[Done]:
    """One finished exchange per text, prompted ``p1``, ``p2``, ..."""
    done = []
    for text in texts:
        gen_id = f"{prefix}{session.chat.turns + 1}"
        await session.handle(Prompt(gen_id, text))
        done.append(await done_of(rec, gen_id))
    return done


def refused(raised: pytest.ExceptionInfo[Exception], frame_id: str | None = None) -> Any:
    """The ``error`` frame the connection would send for it."""
    return error_frame(raised.value, frame_id)


async def test_done_turn_numbers_each_kept_exchange_from_one() -> None:
    session, rec = make_session(ScriptedEngine())
    done = await turns(session, rec, "one", "two", "three")
    assert [d.turn for d in done] == [1, 2, 3]
    assert session.core.turn_ids == ["p1", "p2", "p3"]


async def test_rewind_keeps_the_first_exchanges_and_answers_rewound() -> None:
    session, rec = make_session(ScriptedEngine())
    await turns(session, rec, "one", "two", "three")
    await session.handle(Rewind(1))
    assert rec.frames[-1] == Rewound(1)
    assert (session.chat.turns, session.core.last_prompt, session.core.turn_ids) == (
        1,
        "p1",
        ["p1"],
    )
    await session.handle(Prompt("b", "again"))
    assert (await done_of(rec, "b")).turn == 2


async def test_the_prompt_after_a_rewind_is_a_fresh_conversation_of_the_kept_turns() -> None:
    engine = ScriptedEngine()
    session, rec = make_session(engine)
    await turns(session, rec, "one", "two", "three")
    await session.handle(Rewind(1))
    await session.handle(Prompt("b", "other"))
    await done_of(rec, "b")
    fresh, fresh_rec = make_session(engine)
    await turns(fresh, fresh_rec, "one", "other")
    assert engine.requests[3].prompt_ids == engine.requests[-1].prompt_ids
    assert engine.forgotten == []  # the engine keeps the session's cache: the prefix is reused


async def test_rewind_to_the_count_held_changes_nothing_and_to_zero_empties_it() -> None:
    session, rec = make_session(ScriptedEngine())
    await turns(session, rec, "one", "two")
    before = session.chat.export_state()
    await session.handle(Rewind(2))
    assert rec.frames[-1] == Rewound(2) and session.chat.export_state() == before
    await session.handle(Rewind(0))
    assert rec.frames[-1] == Rewound(0)
    assert (session.chat.turns, session.core.last_prompt) == (0, None)


@pytest.mark.parametrize("keep", [3, 10])
async def test_rewinding_past_the_start_is_invalid_params_and_says_how_many_it_holds(
    keep: int,
) -> None:
    session, rec = make_session(ScriptedEngine())
    await turns(session, rec, "one", "two")
    before = len(rec.frames)
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Rewind(keep))
    error = refused(raised)
    assert (error.code, error.id) == (ErrorCode.INVALID_PARAMS, None)
    assert "holds 2 exchanges" in error.message
    assert session.chat.turns == 2 and len(rec.frames) == before


async def test_a_rewind_during_a_reply_is_busy_and_changes_nothing() -> None:
    session, rec = make_session(slow())
    await turns(session, rec, "one")
    await session.handle(Prompt("b", "two"))
    await rec.wait_for(lambda f: isinstance(f, Token) and f.id == "b")
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Rewind(0))
    assert (raised.value.code, raised.value.id) == (ErrorCode.BUSY, None)
    assert session.state is SessionState.RUNNING and session.chat.turns == 1
    await session.handle(Cancel())
    done = await done_of(rec, "b")
    assert (done.reason, done.turn, session.chat.turns) == (FinishReason.CANCELLED, 2, 2)
    assert rec.of(Rewound) == []


async def test_staged_images_the_system_prompt_and_defaults_survive_a_rewind() -> None:
    engine = ScriptedEngine(images=True)
    rewound, rec = make_session(engine)
    fresh, fresh_rec = make_session(engine)
    for session in (rewound, fresh):
        await session.handle(Configure("be brief", GenerationParams(max_new_tokens=3)))
    await turns(rewound, rec, "one", "two")
    for session, recorder in ((rewound, rec), (fresh, fresh_rec)):
        await session.handle(Image("i", PNG_1X1))
        await recorder.wait_for(lambda f: isinstance(f, ImageOk))
    await rewound.handle(Rewind(0))
    assert rewound.chat.system == "be brief"
    for session, recorder in ((rewound, rec), (fresh, fresh_rec)):
        await session.handle(Prompt("b", "what is it?"))
        await done_of(recorder, "b")
    after_rewind, after_nothing = engine.requests[-2:]
    assert after_rewind.new_images == 1 and after_rewind.params.max_new_tokens == 3
    assert after_rewind.prompt_ids == after_nothing.prompt_ids


async def test_a_rewind_is_a_turn_boundary_and_counted() -> None:
    saved: list[int] = []
    counted: list[bool] = []
    hooks = SessionHooks(boundary=lambda s: saved.append(s.chat.turns), on_rewind=counted.append)
    session, rec = make_session(ScriptedEngine(), hooks=hooks)
    await turns(session, rec, "one", "two")
    await session.handle(Rewind(1))
    assert saved[-1] == 1 and counted == [False]
    await session.handle(Regenerate("r"))
    await done_of(rec, "r")
    assert counted == [False, True]


# -- regenerate ------------------------------------------------------------------------------


async def test_regenerate_replaces_the_last_exchange_with_a_new_reply_to_the_same_turn() -> None:
    engine = ScriptedEngine(images=True)
    session, rec = make_session(engine)
    await turns(session, rec, "one")
    await session.handle(Prompt("p2", "two", images=(PNG_1X1,)))
    await done_of(rec, "p2")
    await session.handle(Regenerate("r", GenerationParams(max_new_tokens=3)))
    done = await done_of(rec, "r")
    first, last = engine.requests[1], engine.requests[-1]
    assert last.prompt_ids == first.prompt_ids and len(last.images) == 1
    assert last.params.max_new_tokens == 3 and first.params.max_new_tokens != 3
    assert (done.turn, done.usage.completion_tokens) == (2, 3)
    assert (session.chat.turns, session.core.turn_ids) == (2, ["p1", "r"])
    assert len(session.chat.export_state()["exchanges"][-1]["reply"]) == 3
    with pytest.raises(ProtocolError) as reused:  # the regenerate's id is used up
        await session.handle(Prompt("r", "x"))
    assert reused.value.code is ErrorCode.INVALID_PARAMS


async def test_regenerate_takes_the_session_defaults_not_the_replaced_replys_params() -> None:
    engine = ScriptedEngine()
    session, rec = make_session(engine)
    await session.handle(Prompt("p1", "one", params=GenerationParams(max_new_tokens=2)))
    await done_of(rec, "p1")
    await session.handle(Regenerate("r"))
    await done_of(rec, "r")
    assert engine.requests[-1].params.max_new_tokens == 256


async def test_regenerate_leaves_staged_images_staged() -> None:
    engine = ScriptedEngine(images=True)
    session, rec = make_session(engine)
    await turns(session, rec, "one")
    await session.handle(Image("i", PNG_1X1))
    await rec.wait_for(lambda f: isinstance(f, ImageOk))
    await session.handle(Regenerate("r"))
    await done_of(rec, "r")
    assert engine.requests[-1].images == []
    await session.handle(Prompt("b", "and this?"))
    await done_of(rec, "b")
    assert engine.requests[-1].new_images == 1


async def test_a_regenerate_holds_the_images_of_the_exchange_it_replaces_once() -> None:
    engine = ScriptedEngine(
        lambda r: Script([f" t{i}" for i in range(50)], delay_s=0.02), images=True
    )
    hub = session_hub(engine, max_queue=4)
    (busy, _), (session, rec) = make_session(engine, hub), make_session(engine, hub)
    await session.handle(
        Prompt("p1", "this?", images=(PNG_1X1,), params=GenerationParams(max_new_tokens=2))
    )
    await done_of(rec, "p1")
    held = image_bytes_of(session)
    assert held > 0
    await busy.handle(Prompt("a", "hog the slot"))
    await session.handle(Regenerate("r"))
    assert session.state is SessionState.QUEUED and image_bytes_of(session) == held
    await busy.close()
    await rec.wait_for(lambda f: isinstance(f, Start) and f.id == "r")
    assert image_bytes_of(session) == held
    await session.handle(Cancel())
    await done_of(rec, "r")
    assert image_bytes_of(session) == held


async def test_regenerate_with_nothing_to_regenerate_is_invalid_params_with_its_id() -> None:
    session, _ = make_session(ScriptedEngine())
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Regenerate("r"))
    assert (raised.value.code, raised.value.id) == (ErrorCode.INVALID_PARAMS, "r")
    assert "no exchange" in raised.value.message and "r" not in export_state(session)["ids"]


async def test_regenerate_refusals_come_in_the_order_of_the_spec_and_change_nothing() -> None:
    session, rec = make_session(ScriptedEngine(), max_new_tokens=100)
    await turns(session, rec, "one")
    before = session.chat.export_state()
    over = GenerationParams(max_new_tokens=101)
    # a reused id comes before the params over the limit
    with pytest.raises(ProtocolError) as reused:
        await session.handle(Regenerate("p1", over))
    assert (reused.value.code, reused.value.id) == (ErrorCode.INVALID_PARAMS, "p1")
    assert "already used" in reused.value.message
    with pytest.raises(ProtocolError) as too_many:
        await session.handle(Regenerate("r", over))
    assert (too_many.value.code, too_many.value.id) == (ErrorCode.INVALID_PARAMS, "r")
    assert "max_new_tokens" in too_many.value.message
    assert session.chat.export_state() == before and session.state is SessionState.IDLE
    await session.handle(Regenerate("r"))  # its id was not used by the refusals
    assert (await done_of(rec, "r")).turn == 1


async def test_a_regenerate_while_a_generation_runs_or_waits_is_busy_with_its_id() -> None:
    session, rec = make_session(slow())
    await turns(session, rec, "one")
    await session.handle(Prompt("b", "two"))
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Regenerate("r"))
    assert (raised.value.code, raised.value.id) == (ErrorCode.BUSY, "r")
    await session.handle(Cancel())
    await done_of(rec, "b")


async def test_a_regenerate_that_does_not_fit_the_context_is_context_overflow() -> None:
    """A turn that fitted where it was prompted, resumed on a server with a smaller context."""
    wide, wide_rec = make_session(ScriptedEngine(context_tokens=4096))
    await turns(wide, wide_rec, "x" * 150)
    session, _ = make_session(ScriptedEngine(context_tokens=128))
    import_state(session, unpack(pack(export_state(wide))))
    with pytest.raises(ConversationTooLong) as raised:
        await session.handle(Regenerate("r"))
    assert refused(raised, "r").code is ErrorCode.CONTEXT_OVERFLOW
    assert session.state is SessionState.IDLE and "r" not in export_state(session)["ids"]


async def test_a_regenerate_finding_the_queue_full_is_overloaded() -> None:
    engine = slow()
    hub = session_hub(engine, max_queue=0)
    (busy, _), (session, rec) = make_session(engine, hub), make_session(engine, hub)
    await turns(session, rec, "one")
    await busy.handle(Prompt("a", "hog the slot"))
    with pytest.raises(ProtocolError) as raised:
        await session.handle(Regenerate("r"))
    assert raised.value.code is ErrorCode.OVERLOADED and session.chat.turns == 1
    await busy.close()


async def test_a_regenerate_cancelled_while_queued_keeps_the_old_exchange() -> None:
    engine = slow()
    hub = session_hub(engine, max_queue=4)
    (busy, _), (session, rec) = make_session(engine, hub), make_session(engine, hub)
    await session.handle(Prompt("p1", "one", params=GenerationParams(max_new_tokens=2)))
    await done_of(rec, "p1")
    before = session.chat.export_state()
    await busy.handle(Prompt("a", "hog the slot"))
    await session.handle(Regenerate("r"))
    await session.handle(Cancel("r"))
    done = await done_of(rec, "r")
    assert (done.reason, done.turn, rec.of(Start, "r")) == (FinishReason.CANCELLED, None, [])
    assert session.chat.export_state() == before and session.core.last_prompt == "p1"
    await busy.close()


async def test_a_regenerate_that_fails_keeps_the_old_exchange() -> None:
    fail = {"now": False}

    def script(request: Any) -> Script:
        return Script([" a", " b", " c"], fail_after=1 if fail["now"] else None)

    session, rec = make_session(ScriptedEngine(script))
    await turns(session, rec, "one")
    before = session.chat.export_state()
    fail["now"] = True
    await session.handle(Regenerate("r"))
    done = await done_of(rec, "r")
    assert (done.reason, done.turn) == (FinishReason.ERROR, None)
    assert session.chat.export_state() == before and session.core.last_prompt == "p1"


async def test_a_regenerate_cancelled_mid_reply_replaces_the_exchange() -> None:
    session, rec = make_session(slow())
    await session.handle(Prompt("p1", "one", params=GenerationParams(max_new_tokens=2)))
    await done_of(rec, "p1")
    await session.handle(Regenerate("r"))
    await rec.wait_for(lambda f: isinstance(f, Token) and f.id == "r")
    await session.handle(Cancel())
    done = await done_of(rec, "r")
    assert (done.reason, done.turn, session.chat.turns) == (FinishReason.CANCELLED, 1, 1)
    assert session.core.turn_ids == ["r"]
    reply = session.chat.conversation.exchanges[0].reply_ids
    assert len(reply) == done.usage.completion_tokens


# -- stored state ----------------------------------------------------------------------------


async def test_the_ids_of_the_exchanges_go_with_the_stored_state() -> None:
    session, rec = make_session(ScriptedEngine())
    await turns(session, rec, "one", "two", "three")
    await session.handle(Rewind(2))
    state = unpack(pack(export_state(session)))
    rebuilt, _ = make_session(ScriptedEngine())
    import_state(rebuilt, state)
    assert (rebuilt.core.turn_ids, rebuilt.core.last_prompt, rebuilt.chat.turns) == (
        ["p1", "p2"],
        "p2",
        2,
    )


async def test_a_state_stored_without_the_ids_of_its_exchanges_knows_the_last_one() -> None:
    session, rec = make_session(ScriptedEngine())
    await turns(session, rec, "one", "two")
    state = export_state(session)
    del state["turn_ids"]
    rebuilt, rebuilt_rec = make_session(ScriptedEngine())
    import_state(rebuilt, state)
    assert rebuilt.core.turn_ids == [None, "p2"]
    await rebuilt.handle(Rewind(1))
    assert rebuilt.core.last_prompt is None and rebuilt_rec.frames[-1] == Rewound(1)


async def test_a_regenerate_exported_mid_reply_comes_back_in_place_of_the_last_exchange() -> None:
    """What a replica that died during a regenerate leaves: the rebuilt session holds the new
    reply, cancelled, in place of the exchange it was replacing."""
    session, rec = make_session(slow())
    await session.handle(Prompt("p1", "one", params=GenerationParams(max_new_tokens=2)))
    await done_of(rec, "p1")
    await session.handle(Prompt("p2", "two", params=GenerationParams(max_new_tokens=2)))
    await done_of(rec, "p2")
    await session.handle(Regenerate("r"))
    await rec.wait_for(lambda f: isinstance(f, Token) and f.id == "r" and f.index >= 2)
    state, partial = unpack(pack(export_state(session))), reply_checkpoint(session)
    await session.close()
    assert partial is not None and partial["id"] == "r"
    rebuilt, _ = make_session(ScriptedEngine())
    import_state(rebuilt, state, partial)
    assert (rebuilt.chat.turns, rebuilt.core.turn_ids) == (2, ["p1", "r"])
    assert rebuilt.chat.export_state()["exchanges"][-1]["reply"] == partial["ids"]


# -- through a server ------------------------------------------------------------------------


async def test_a_session_resumed_after_a_rewind_goes_on_from_the_rewound_conversation() -> None:
    async def exchange(peer: RawPeer, gen_id: str, text: str) -> dict[str, Any]:
        await peer.send({"type": "prompt", "id": gen_id, "text": text})
        return (await peer.recv_until("done"))[-1]

    async with running_server(ScriptedEngine()) as url:
        async with raw_peer(url) as (peer, ready):
            for i, text in enumerate(("one", "two", "three"), 1):
                await exchange(peer, f"p{i}", text)
            await peer.send({"type": "rewind", "keep": 2})
            assert await peer.recv() == {"type": "rewound", "turns": 2}
        resume = f"{url}?session={ready['session']}&resume={ready['resume']}"
        async with raw_peer(resume) as (peer, resumed):
            after = await exchange(peer, "p4", "four")
        async with raw_peer(url) as (peer, _):
            for i, text in enumerate(("one", "two"), 1):
                await exchange(peer, f"p{i}", text)
            fresh = await exchange(peer, "p3", "four")
    assert resumed["session"] == ready["session"]
    assert resumed["resumed"] == {"last_prompt": "p2", "reply": None, "turns": 2}
    assert after["turn"] == fresh["turn"] == 3
    assert after["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]

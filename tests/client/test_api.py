"""The client library against a real uvicorn serving a scripted engine."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from wschat.client import (
    BusyError,
    Chat,
    ContextOverflowError,
    InternalError,
    InvalidParamsError,
    NotRunningError,
    OverloadedError,
    TooLargeError,
    connect,
)
from wschat.protocol import Done, FinishReason
from wschat.server.engine import Engine

from tests.client.engines import WAIT, failing_engine, is_sublist, slow_engine
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import running_server, wait_until


async def first_piece(reply: object) -> str:
    async with asyncio.timeout(WAIT):
        return await anext(reply)  # type: ignore[call-overload,no-any-return]


async def rest(reply: object) -> list[str]:
    async with asyncio.timeout(WAIT):
        return [piece async for piece in reply]  # type: ignore[attr-defined]


async def test_prompt_streams_pieces_that_join_to_done_text() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("hello")
        pieces = await rest(reply)
        assert isinstance(reply.done, Done)
        assert "".join(pieces) == reply.done.text == "".join(f" w{i}" for i in range(8))
        assert reply.done.reason is FinishReason.STOP
        assert reply.start is not None and reply.start.prompt_tokens > 0
        assert reply.text == reply.done.text and reply.finished


async def test_prompt_ends_with_length_at_max_new_tokens() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        done = await chat.prompt("hello", max_new_tokens=3).wait(WAIT)
        assert done.reason is FinishReason.LENGTH
        assert done.text == " w0 w1 w2" and done.usage.completion_tokens == 3


async def test_cancel_mid_stream_sends_one_done_and_the_next_prompt_works() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("go")
        pieces = [await first_piece(reply)]
        reply.cancel()
        pieces += await rest(reply)
        assert reply.done is not None and reply.done.reason is FinishReason.CANCELLED
        assert "".join(pieces) == reply.done.text and len(reply.tokens) < 400
        await chat.ping()  # the server answers in order: any late frame came before the pong
        assert [f for f in chat.unrouted if getattr(f, "id", None) == reply.id] == []
        after = await chat.prompt("again", max_new_tokens=2).wait(WAIT)
        assert after.reason is FinishReason.LENGTH and after.text == " s0 s1"


async def test_chat_cancel_without_id_stops_the_running_reply() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("go")
        await first_piece(reply)
        await chat.cancel()
        assert (await reply.wait(WAIT)).reason is FinishReason.CANCELLED


async def test_reply_left_early_as_context_manager_is_cancelled() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        async with chat.prompt("go") as reply:
            await first_piece(reply)
        assert reply.done is not None and reply.done.reason is FinishReason.CANCELLED


async def test_second_prompt_while_one_runs_raises_busy_and_the_first_goes_on() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        first = chat.prompt("go", max_new_tokens=20)
        await first_piece(first)
        second = chat.prompt("too soon")
        with pytest.raises(BusyError) as refused:
            await second.wait(WAIT)
        assert refused.value.id == second.id and second.done is None
        assert (await first.wait(WAIT)).reason is FinishReason.LENGTH


async def test_cancel_naming_no_generation_raises_not_running() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        with pytest.raises(NotRunningError) as refused:
            await chat.cancel("never-sent")
        assert refused.value.id == "never-sent"


async def test_cancel_of_a_finished_reply_is_silent() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("hello")
        await reply.wait(WAIT)
        await chat.cancel(reply.id)
        assert [f for f in chat.unrouted if getattr(f, "id", None) == reply.id] == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": 3.0}, "temperature must be in [0, 2]"),
        ({"temp": 1.0}, "unknown parameter 'temp'"),
        ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
        ({"stop": ["ok", ""]}, "each stop string must be 1 to 64 characters"),
    ],
)
async def test_bad_params_are_refused_before_sending(params: dict[str, Any], message: str) -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url, connect(url, timeout=WAIT) as chat:
        with pytest.raises(InvalidParamsError) as refused:
            chat.prompt("hello", **params)
        assert refused.value.message == message
        with pytest.raises(InvalidParamsError):
            await chat.configure(**params)
        await chat.ping()
        assert engine.requests == []


async def test_server_refuses_max_new_tokens_over_its_limit() -> None:
    async with (
        running_server(ScriptedEngine(), max_new_tokens=50) as url,
        connect(url, timeout=WAIT) as chat,
    ):
        reply = chat.prompt("hello", max_new_tokens=51)
        with pytest.raises(InvalidParamsError) as refused:
            await reply.wait(WAIT)
        assert refused.value.message == "max_new_tokens must be at most 50"
        assert refused.value.id == reply.id


async def test_server_refuses_a_reused_id() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        await chat.prompt("hello", id="mine").wait(WAIT)
        with pytest.raises(InvalidParamsError) as refused:
            await chat.prompt("again", id="mine").wait(WAIT)
        assert refused.value.message == "id 'mine' was already used in this session"


async def test_reset_mid_generation_ends_the_reply_cancelled_and_clears_the_conversation() -> None:
    engine = slow_engine()
    async with running_server(engine) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("go")
        await first_piece(reply)
        await chat.reset()
        assert reply.done is not None and reply.done.reason is FinishReason.CANCELLED
        await chat.prompt("go", max_new_tokens=2).wait(WAIT)
        assert engine.requests[1].prompt_ids == engine.requests[0].prompt_ids


async def test_configure_sets_the_system_prompt_and_default_params() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url, connect(url, timeout=WAIT) as chat:
        await chat.configure(system="Answer in French.", max_new_tokens=2)
        done = await chat.prompt("hello").wait(WAIT)
        assert done.reason is FinishReason.LENGTH and done.usage.completion_tokens == 2
        system_ids = engine.tokenize_text("Answer in French.")
        assert is_sublist(system_ids, engine.requests[-1].prompt_ids)


async def test_configure_while_generating_raises_busy() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("go")
        await first_piece(reply)
        with pytest.raises(BusyError):
            await chat.configure(system="late")
        reply.cancel()
        await reply.wait(WAIT)


async def test_ping_round_trips_while_a_reply_streams() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("go")
        await first_piece(reply)
        rtt = await chat.ping()
        assert 0 < rtt < WAIT and not reply.finished
        reply.cancel()
        await reply.wait(WAIT)


@pytest.mark.parametrize(
    ("engine", "settings", "error"),
    [
        (ScriptedEngine(), {"max_prompt_bytes": 16}, TooLargeError),
        (ScriptedEngine(context_tokens=64), {}, ContextOverflowError),
    ],
)
async def test_error_frames_raise_their_typed_exception(
    engine: ScriptedEngine, settings: dict[str, Any], error: type[Exception]
) -> None:
    async with running_server(engine, **settings) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("a prompt of more than sixty four characters, " * 2)
        with pytest.raises(error):
            await reply.wait(WAIT)
        assert (await chat.prompt("ok").wait(WAIT)).reason is FinishReason.STOP


async def test_full_queue_raises_overloaded_and_a_queued_prompt_shows_its_place() -> None:
    async with (
        running_server(slow_engine(), max_concurrent=1, max_queue=1) as url,
        connect(url, timeout=WAIT) as one,
        connect(url, timeout=WAIT) as two,
        connect(url, timeout=WAIT) as three,
    ):
        running = one.prompt("go")
        await first_piece(running)
        waiting = two.prompt("wait", max_new_tokens=2)
        await wait_until(lambda: waiting.position == 1, WAIT)
        with pytest.raises(OverloadedError):
            await three.prompt("no room").wait(WAIT)
        running.cancel()
        assert (await waiting.wait(WAIT)).reason is FinishReason.LENGTH


async def test_generation_failure_raises_internal_after_done_reason_error() -> None:
    async with running_server(failing_engine(after=2)) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.prompt("hello")
        pieces = []
        with pytest.raises(InternalError) as failed:
            async with asyncio.timeout(WAIT):
                async for piece in reply:
                    pieces.append(piece)
        assert failed.value.message == "generation failed"
        assert reply.done is not None and reply.done.reason is FinishReason.ERROR
        assert "".join(pieces) == reply.done.text == " a b"
        assert (await chat.ping()) > 0  # the session goes on


async def test_resume_token_picks_the_session_up_on_a_new_connection() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        async with connect(url, timeout=WAIT) as chat:
            await chat.prompt("hello").wait(WAIT)
            session, token = chat.session, chat.resume_token
        async with connect(url, timeout=WAIT, resume=token) as again:
            assert again.session == session
            await again.prompt("more").wait(WAIT)
        first, second = engine.requests
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids


# -- rewind, regenerate, edit (PROTOCOL.md section 5) ----------------------------------------


async def talk(chat: Chat, *texts: str, **params: Any) -> list[Done]:
    """Prompt each text in turn, each reply to its end."""
    return [await chat.prompt(text, **params).wait(WAIT) for text in texts]


async def fresh_prompt_ids(url: str, engine: ScriptedEngine, *texts: str) -> list[int]:
    """The prompt ids of the last of ``texts`` in a new session that said only ``texts``."""
    async with connect(url, timeout=WAIT) as chat:
        await talk(chat, *texts)
    return engine.requests[-1].prompt_ids


async def test_each_kept_reply_is_numbered_and_turns_counts_the_exchanges() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        assert chat.turns == 0
        turns = []
        for text in ("a", "b", "c"):
            reply = chat.prompt(text)
            await reply.wait(WAIT)
            turns.append(reply.turn)
        assert turns == [1, 2, 3] and chat.turns == 3


async def test_rewind_keeps_the_first_exchanges_and_the_next_prompt_follows_them() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        async with connect(url, timeout=WAIT) as chat:
            await talk(chat, "first", "second", "third")
            assert await chat.rewind(1) == 1 and chat.turns == 1
            done = await chat.prompt("other").wait(WAIT)
            rewound = engine.requests[-1].prompt_ids
        assert done.turn == 2
        assert rewound == await fresh_prompt_ids(url, engine, "first", "other")


async def test_rewind_to_what_the_conversation_holds_changes_nothing() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        await talk(chat, "a", "b")
        assert await chat.rewind(2) == 2 and chat.turns == 2
        assert await chat.rewind(0) == 0 and chat.turns == 0


async def test_edit_replaces_message_k_and_drops_the_exchanges_after_it() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        async with connect(url, timeout=WAIT) as chat:
            await talk(chat, "first", "second", "third")
            reply = await chat.edit(2, "edited")
            pieces = await rest(reply)
            edited = engine.requests[-1].prompt_ids
            assert "".join(pieces) == reply.text and reply.turn == 2 and chat.turns == 2
        assert edited == await fresh_prompt_ids(url, engine, "first", "edited")


async def test_regenerate_replaces_the_last_reply_answering_the_same_message() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        async with connect(url, timeout=WAIT) as chat:
            await talk(chat, "first", "second")
            reply = chat.regenerate(max_new_tokens=3)
            assert "".join(await rest(reply)) == " w0 w1 w2"
            assert reply.turn == 2 and chat.turns == 2
            assert engine.requests[-1].prompt_ids == engine.requests[-2].prompt_ids
            await talk(chat, "third")
            after = engine.requests[-1].prompt_ids
        async with connect(url, timeout=WAIT) as fresh:
            await talk(fresh, "first")
            await talk(fresh, "second", max_new_tokens=3)
            await talk(fresh, "third")
        assert after == engine.requests[-1].prompt_ids  # the short reply, not the first one


async def test_a_regenerate_that_fails_keeps_the_earlier_reply() -> None:
    scripts = iter([Script([" kept"]), Script([" a"], fail_after=0), Script([" ok"])])
    engine = ScriptedEngine(lambda request: next(scripts))
    async with running_server(engine) as url, connect(url, timeout=WAIT) as chat:
        await talk(chat, "hello")
        reply = chat.regenerate()
        with pytest.raises(InternalError):
            await reply.wait(WAIT)
        assert reply.done is not None and reply.turn is None and chat.turns == 1
        assert (await chat.prompt("more").wait(WAIT)).turn == 2
        hello = engine.requests[0].prompt_ids
        assert engine.requests[-1].prompt_ids[: len(hello) + 1] == [*hello, 1000]  # " kept"


async def test_rewind_or_edit_past_the_conversation_raises_invalid_params() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        await talk(chat, "a")
        with pytest.raises(InvalidParamsError) as refused:
            await chat.rewind(2)
        assert "1" in refused.value.message and refused.value.id is None
        with pytest.raises(InvalidParamsError):
            await chat.rewind(-1)
        with pytest.raises(InvalidParamsError) as local:
            await chat.edit(2, "no such message")
        assert local.value.message == "there is no message 2 to edit; the conversation holds 1"
        with pytest.raises(InvalidParamsError):  # checked before anything is rewound
            await chat.edit(1, "bad params", temperature=3.0)
        with pytest.raises(TypeError):
            await chat.rewind(True)
        assert chat.turns == 1 and await chat.rewind(1) == 1


async def test_regenerate_in_an_empty_conversation_raises_invalid_params() -> None:
    async with running_server(ScriptedEngine()) as url, connect(url, timeout=WAIT) as chat:
        reply = chat.regenerate()
        with pytest.raises(InvalidParamsError) as refused:
            await reply.wait(WAIT)
        assert refused.value.id == reply.id and reply.done is None
        await talk(chat, "a")
        await chat.reset()
        assert chat.turns == 0
        with pytest.raises(InvalidParamsError):
            await chat.regenerate().wait(WAIT)


async def test_rewind_regenerate_and_edit_while_a_reply_runs_raise_busy() -> None:
    async with running_server(slow_engine()) as url, connect(url, timeout=WAIT) as chat:
        await talk(chat, "a", max_new_tokens=2)
        running = chat.prompt("go")
        await first_piece(running)
        with pytest.raises(BusyError):
            await chat.rewind(0)
        with pytest.raises(BusyError):
            await chat.regenerate().wait(WAIT)
        with pytest.raises(BusyError):
            await chat.edit(1, "b")
        assert not running.finished
        running.cancel()
        assert (await running.wait(WAIT)).turn == 2 and chat.turns == 2  # kept, cut short


async def test_a_resumed_session_says_how_many_exchanges_it_holds() -> None:
    engine = ScriptedEngine()
    async with running_server(engine) as url:
        async with connect(url, timeout=WAIT) as chat:
            await talk(chat, "first", "second", "third")
            await chat.rewind(2)
            token = chat.resume_token
        async with connect(url, timeout=WAIT, resume=token) as again:
            assert again.turns == 2
            assert (await (await again.edit(2, "edited")).wait(WAIT)).turn == 2
            edited = engine.requests[-1].prompt_ids
        assert edited == await fresh_prompt_ids(url, engine, "first", "edited")


async def test_regenerate_with_the_same_seed_repeats_the_reply_and_another_seed_does_not(
    tiny_text_engine: Engine,
) -> None:
    sampled: dict[str, Any] = {"temperature": 1.0, "max_new_tokens": 8}
    async with running_server(tiny_text_engine) as url, connect(url, timeout=WAIT) as chat:
        first = await chat.prompt("hello", seed=5, **sampled).wait(WAIT)
        again = await chat.regenerate(seed=5, **sampled).wait(WAIT)
        other = await chat.regenerate(seed=6, **sampled).wait(WAIT)
    assert again.text == first.text != other.text
    assert again.turn == other.turn == 1

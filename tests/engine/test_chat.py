"""The engine boundary at chat turns: a session's ``Chat(engine, key)`` keeps the conversation,
counts a turn before it runs, and ends each reply with a ``Finished`` that carries its text and
usage; what it refuses it raises as an engine exception, never a wire error."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from wschat.protocol import FinishReason, ProtocolError
from wschat.server.engine import (
    Chat,
    ConversationTooLong,
    Finished,
    Generation,
    ImagesUnsupported,
    PromptTooLong,
    SamplingParams,
    Turn,
)
from wschat.server.engine.local.batched import BatchedEngine
from wschat.server.engine.local.hf import HFEngine
from wschat.server.engine.local.loader import LoadedModel

from tests.fakes.scripted import ScriptedEngine
from tests.support import collect


@pytest.fixture(params=["generate", "batched"])
async def engine(
    request: pytest.FixtureRequest, tiny_text_loaded: LoadedModel
) -> AsyncIterator[HFEngine | BatchedEngine]:
    made: HFEngine | BatchedEngine = (
        HFEngine(tiny_text_loaded)
        if request.param == "generate"
        else BatchedEngine(tiny_text_loaded)
    )
    yield made
    await made.aclose()


async def say(chat: Chat, text: str, tokens: int = 6, scope: str = "") -> tuple[str, Finished, int]:
    prepared = await chat.prepare(Turn(text, SamplingParams(tokens)), max_user_tokens=1000)
    generation = chat.start(prepared, scope=scope)
    streamed, finished = await collect(generation)
    return streamed, finished, prepared.prompt_tokens


async def test_finished_carries_the_reply_text_and_its_usage(
    engine: HFEngine | BatchedEngine,
) -> None:
    chat = Chat(engine, "s")
    first_text, first, first_prompt = await say(chat, "Hello there")
    second_text, second, second_prompt = await say(chat, "And again")
    for text, finished, prompt in (
        (first_text, first, first_prompt),
        (second_text, second, second_prompt),
    ):
        assert finished.reason is FinishReason.LENGTH
        assert finished.text == text and text
        usage = finished.usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, 6)
    assert first.usage is not None and second.usage is not None
    assert first.usage.cached_tokens == 0
    # the first turn's prompt and reply, but the reply's last token (never fed back)
    assert second.usage.cached_tokens == first_prompt + 6 - 1
    assert chat.turns == 2 and chat.generated_tokens == 12


async def test_a_reset_chat_starts_afresh_and_keeps_its_system_prompt(
    engine: HFEngine | BatchedEngine,
) -> None:
    chat = Chat(engine, "s")
    await chat.set_system("Be brief.", min_turn_tokens=32)
    _, _, alone = await say(chat, "Hello")
    await say(chat, "Again")
    chat.reset()
    _, finished, after_reset = await say(chat, "Hello")
    assert after_reset == alone and chat.turns == 1 and chat.system == "Be brief."
    # nothing of the session's is kept: only the opening every session with it shares
    opening = engine.prompt_format.opening(engine.prompt_format.tokenize_system("Be brief."))
    assert finished.usage is not None and finished.usage.cached_tokens == len(opening)


async def test_refusals_are_engine_exceptions_that_change_nothing() -> None:
    engine = ScriptedEngine(context_tokens=64)
    chat = Chat(engine, "s")
    with pytest.raises(PromptTooLong):
        await chat.prepare(Turn("x" * 20, SamplingParams(4)), max_user_tokens=10)
    with pytest.raises(ConversationTooLong, match="shorten the prompt"):
        await chat.prepare(Turn("x" * 60, SamplingParams(4)), max_user_tokens=100)
    with pytest.raises(PromptTooLong):
        await chat.set_system("x" * 60, min_turn_tokens=32)
    with pytest.raises(ImagesUnsupported):
        await chat.prepare(Turn("look", SamplingParams(4), ["an image"]), max_user_tokens=100)
    assert chat.system is None and chat.turns == 0 and engine.requests == []
    for refusal in (PromptTooLong, ConversationTooLong, ImagesUnsupported):
        assert not issubclass(refusal, ProtocolError)


def test_one_cancel_hook_sets_the_flag_a_worker_thread_reads() -> None:
    generation = Generation()
    assert not generation.cancel_flag.is_set()
    generation.cancel()
    generation.cancel()  # a second cancel (reset after cancel) changes nothing
    assert generation.cancel_flag.is_set()  # what a worker thread reads each step


async def test_a_chats_requests_say_how_long_their_opening_is() -> None:
    engine = ScriptedEngine()
    chat = Chat(engine, "s")
    await chat.set_system("Be brief.", min_turn_tokens=32)
    await say(chat, "Hello")
    await say(chat, "Again")
    system = engine.prompt_format.tokenize_system("Be brief.")
    opening = engine.prompt_format.opening(system)
    first, second = engine.requests
    assert first.opening == second.opening == len(opening) > len(system)
    assert first.prompt_ids[: len(opening)] == second.prompt_ids[: len(opening)] == opening


async def test_a_chats_opening_is_its_owners_only_with_a_system_prompt() -> None:
    engine = ScriptedEngine()
    chat = Chat(engine, "s")
    owner = "owner-digest"
    await say(chat, "Hello", scope=owner)  # the format's own opening: everyone's
    await chat.set_system("Be brief.", min_turn_tokens=32)
    await say(chat, "Hello", scope=owner)
    await chat.set_system(None, min_turn_tokens=32)
    await say(chat, "Hello", scope=owner)
    assert [r.opening_scope for r in engine.requests] == ["", "owner-digest", ""]
    assert "owner-digest" not in repr(engine.requests[1])


async def test_every_request_of_a_chat_carries_its_owners_cache_scope() -> None:
    engine = ScriptedEngine()
    chat = Chat(engine, "s")
    await say(chat, "Hello")  # no owner yet: no scope
    await say(chat, "Hello", scope="owner-digest")  # without a system prompt too: a remote
    await chat.set_system("Be brief.", min_turn_tokens=32)  # cache holds it all
    await say(chat, "Hello", scope="owner-digest")
    assert [r.cache_scope for r in engine.requests] == ["", "owner-digest", "owner-digest"]
    assert "owner-digest" not in repr(engine.requests[1])

"""A conversation that holds tool calls (engine/tools.py, exchanges.py, history.py): an exchange
is a user turn, the replies that called tools with their results, then the last reply; every
format lays a round out as a model turn and a user turn, each prompt extends the last one (KV
reuse holds across a round), and export, rewind, regenerate and a crashed turn keep or drop
whole exchanges with their rounds."""

from __future__ import annotations

import pytest
from wschat.protocol import FinishReason, ToolResult, ToolSpec
from wschat.server.engine import Chat, FunctionCall, SamplingParams, ToolUse, Turn
from wschat.server.engine.local.loader import LoadedModel

from tests.engine.local_turns import make_engine
from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import collect

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TOOLS = ToolUse((WEATHER,))
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
ANSWER = " It is sunny in Paris."


def scripted() -> ScriptedEngine:
    engine = ScriptedEngine()
    engine.script = lambda request: (
        Script([ANSWER])
        if last_user_turn(engine, request.prompt_ids).startswith('{"tool_results"')
        else Script([CALL[:12], CALL[12:40], CALL[40:]])
    )
    return engine


def last_user_turn(engine: ScriptedEngine, ids: list[int]) -> str:
    """The text of the prompt's last user turn (GemmaTurns: after the last ``user\\n``)."""
    text = engine.decode(ids)
    return text.rsplit("user\n", 1)[-1].removesuffix("\nmodel\n").strip()


async def ask(chat: Chat, text: str, tools: ToolUse | None = TOOLS) -> tuple[str, int]:
    prepared = await chat.prepare(Turn(text, SamplingParams(64), (), tools), max_user_tokens=999)
    streamed, finished = await collect(chat.start(prepared))
    assert finished.reason is FinishReason.STOP
    return streamed, len(prepared.prompt_ids)


async def answer(chat: Chat, result: str, tools: ToolUse | None = TOOLS) -> str:
    (call,) = chat.pending_calls
    prepared = await chat.prepare_results([ToolResult(call.id, result)], SamplingParams(64), tools)
    streamed, _ = await collect(chat.start(prepared))
    return streamed


async def test_a_call_awaits_its_result_and_the_answer_joins_the_same_exchange() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    called, _ = await ask(chat, "Weather in Paris?")
    assert called == CALL and chat.turns == 1
    (call,) = chat.pending_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert call.id.startswith("call_")
    assert await answer(chat, '{"sky": "clear"}') == ANSWER
    assert chat.turns == 1 and chat.pending_calls == ()
    (exchange,) = chat.conversation.exchanges
    assert len(exchange.rounds) == 1 and exchange.calls == ()


async def test_a_round_is_a_model_turn_then_a_user_turn_of_results_after_the_tools() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    await chat.set_system("Be brief.", min_turn_tokens=32)
    await ask(chat, "Weather in Paris?")
    await answer(chat, '{"sky": "clear"}')
    request = engine.requests[-1]
    text = engine.decode(request.prompt_ids)
    description = TOOLS.prompt_text()
    assert text.startswith(f"user\nBe brief.\n\n{description}\n\nWeather in Paris?\n")
    results = '{"tool_results": [{"name": "get_weather", "content": {"sky": "clear"}}]}'
    assert text.endswith(f"user\n{results}\nmodel\n")
    # the call as generated (scripted ids stand for its text), between the two user turns
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]


async def test_every_prompt_of_a_tool_loop_extends_the_one_before() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    await ask(chat, "Weather in Paris?")
    await answer(chat, "sunny")
    await ask(chat, "And tomorrow?")
    first, second, third = (r.prompt_ids for r in engine.requests)
    assert second[: len(first)] == first and third[: len(second)] == second


async def test_with_none_the_tools_are_described_and_nothing_is_called() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    none = ToolUse((WEATHER,), choice="none")
    called, _ = await ask(chat, "Weather in Paris?", none)
    assert called == CALL and chat.pending_calls == ()  # the text it is: no call read
    # the same prompt as a turn that may call them: what the engine cached of it is reused
    assert TOOLS.prompt_text() in engine.decode(engine.requests[-1].prompt_ids)
    await ask(Chat(engine, "t"), "Weather in Paris?", None)
    assert "get_weather" not in engine.decode(engine.requests[-1].prompt_ids)


async def test_export_and_import_keep_the_rounds_and_the_calls_awaiting_results() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    await ask(chat, "Weather in Paris?")
    await answer(chat, "sunny")
    await ask(chat, "And in Rome?")
    state = chat.export_state()
    again = Chat(engine, "t")
    again.import_state(state)
    assert again.export_state() == state and again.pending_calls == chat.pending_calls
    assert await answer(again, "rain") == ANSWER
    state["exchanges"][1]["calls"] = [["call_x", "get_weather"]]
    with pytest.raises(ValueError, match="not an exported tool call"):
        Chat(engine, "u").import_state(state)


async def test_rewind_and_regenerate_drop_an_exchange_with_its_tool_rounds() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    await ask(chat, "Hi")
    await answer(chat, "sunny")
    await ask(chat, "Weather in Paris?")
    await answer(chat, "rain")
    chat.rewind(1)
    assert chat.turns == 1 and len(chat.conversation.exchanges[0].rounds) == 1
    prepared = await chat.prepare_regenerate(SamplingParams(64), TOOLS)
    assert prepared.rounds == () and prepared.replaces and prepared.index == 1
    streamed, _ = await collect(chat.start(prepared))
    assert streamed == CALL
    (exchange,) = chat.conversation.exchanges
    assert exchange.rounds == [] and len(exchange.calls) == 1


async def test_a_results_turn_a_crash_cut_short_is_kept_cancelled_with_its_round() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    await ask(chat, "Weather in Paris?")
    (call,) = chat.pending_calls
    prepared = await chat.prepare_results([ToolResult(call.id, "sunny")], SamplingParams(64), TOOLS)
    chat.start(prepared)
    running = chat.export_running()
    assert running is not None and running["replaces"] and len(running["rounds"]) == 1
    state = chat.export_state()
    await engine.aclose()
    elsewhere = Chat(engine, "t")
    elsewhere.import_state(state)
    elsewhere.add_cancelled(running, [1000])
    (exchange,) = elsewhere.conversation.exchanges
    assert len(exchange.rounds) == 1 and exchange.reply_ids == [1000] and exchange.calls == ()


async def test_results_must_answer_the_calls_that_await_them() -> None:
    engine = scripted()
    chat = Chat(engine, "s")
    await ask(chat, "Weather in Paris?")
    with pytest.raises(ValueError, match="do not answer the calls"):
        await chat.prepare_results([ToolResult("call_other", "x")], SamplingParams(8), TOOLS)


# -- on the tiny model: what the engine keeps is reused across a round -----------------------


@pytest.mark.parametrize("kind", ["generate", "batched"])
async def test_the_results_turn_reuses_the_kv_of_the_call_before_it(
    tiny_text_loaded: LoadedModel, kind: str
) -> None:
    engine = make_engine(tiny_text_loaded, kind)
    try:
        await reused_across_a_round(Chat(engine, "s"))
    finally:
        await engine.aclose()


async def reused_across_a_round(chat: Chat) -> None:
    named = ToolUse((WEATHER,), "named", "get_weather")
    prepared = await chat.prepare(
        Turn("Weather?", SamplingParams(6), (), named), max_user_tokens=99
    )
    _, called = await collect(chat.start(prepared))
    # the tiny random model writes no call: its reply stands for one, as if the grammar made it
    chat.conversation.exchanges[-1].calls = (FunctionCall("call_t0", "get_weather", "{}"),)
    results = [ToolResult("call_t0", "sunny")]
    follow = await chat.prepare_results(results, SamplingParams(4), named)
    _, finished = await collect(chat.start(follow))
    assert finished.usage is not None
    # the first prompt and its reply, but the reply's last token (never fed back)
    assert finished.usage.cached_tokens == len(prepared.prompt_ids) + len(called.completion_ids) - 1

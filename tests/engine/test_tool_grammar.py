"""The grammar a reply that may call tools is held to (engine/tool_grammar.py), compiled by
llguidance on the embedded Gemma 3's tokenizer: forced, only a valid call to a tool it may call
with arguments that match its schema; ``auto``, text or such a call; one call only without
parallel calls; and after the call only a token that ends the reply."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tokenizers import Tokenizer
from wschat.protocol import ToolSpec
from wschat.server.engine import SamplingParams, ToolUse
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.grammar import GrammarCompiler, ResponseFormat
from wschat.server.engine.openai.tokenizer import embedded_tokenizer
from wschat.server.engine.tool_grammar import held_to_tools, tool_lark

VOCAB = 262_144
STOP_IDS = (1, 106)  # <eos>, <end_of_turn>
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
NOW = ToolSpec("now")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(embedded_tokenizer(default_cache_dir())))


@pytest.fixture(scope="module")
def vocabulary(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, VOCAB, STOP_IDS)


def allows(
    vocabulary: GrammarCompiler, tokenizer: Tokenizer, use: ToolUse, text: str, **kw: Any
) -> bool:
    """Whether the reply's format takes ``text`` whole, then a stop token: the forced one as a
    reply's params hold it (held_to_tools), the others as their Lark grammar."""
    if use.forced and not kw:
        held = held_to_tools(SamplingParams(64), use, remote=False).response_format
    else:
        held = ResponseFormat(lark=tool_lark(use, **kw))
    assert held is not None
    matcher = vocabulary.compile(held).matcher()
    try:
        for token in tokenizer.encode(text, add_special_tokens=False).ids:
            matcher.advance(token)
        matcher.advance(STOP_IDS[0])
    except ValueError:
        return False
    return True


def calls(*items: tuple[str, dict[str, Any]]) -> str:
    return json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in items]})


PARIS = ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        (calls(PARIS), True),
        (calls(("get_weather", {"city": "Paris", "unit": "c"})), True),
        (" " + calls(PARIS), False),  # a forced call is the JSON object from its first byte
        (calls(PARIS, ("now", {})), True),
        ("It is sunny.", False),  # forced: text is no call
        (calls(("get_weather", {})), False),  # its required city missing
        (calls(("get_weather", {"city": "Paris", "unit": "k"})), False),  # not in its enum
        (calls(("forecast", {"city": "Paris"})), False),  # no such tool
        (calls(PARIS) + " and more", False),  # nothing after the call but its end
        (calls(PARIS).replace(", ", ",", 1), False),  # JSON as json.dumps writes it
    ],
)
def test_a_required_call_is_a_valid_call_to_an_offered_tool(
    vocabulary: GrammarCompiler, tokenizer: Tokenizer, text: str, allowed: bool
) -> None:
    use = ToolUse((WEATHER, NOW), choice="required")
    assert allows(vocabulary, tokenizer, use, text) is allowed


def test_a_named_choice_allows_that_tool_alone_and_parallel_off_one_call(
    vocabulary: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    named = ToolUse((WEATHER, NOW), choice="named", name="now")
    assert allows(vocabulary, tokenizer, named, calls(("now", {})))
    assert not allows(vocabulary, tokenizer, named, calls(PARIS))
    single = ToolUse((WEATHER, NOW), choice="required", parallel=False)
    assert allows(vocabulary, tokenizer, single, calls(PARIS))
    assert not allows(vocabulary, tokenizer, single, calls(PARIS, ("now", {})))


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ("It is sunny.", True),
        ('{"a": 1} is JSON', True),  # text may begin with a brace
        (calls(PARIS), True),
        ('{"tool_calls": [{"name": "forecast", "arguments": {}}]}', False),
        ('{"tool_calls": oops', False),  # once a call begins, it is one to its end
    ],
)
def test_auto_allows_text_or_a_valid_call(
    vocabulary: GrammarCompiler, tokenizer: Tokenizer, text: str, allowed: bool
) -> None:
    assert allows(vocabulary, tokenizer, ToolUse((WEATHER,)), text) is allowed


def test_auto_with_a_response_formats_schema_allows_that_json_or_a_call(
    vocabulary: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    use = ToolUse((WEATHER,))
    assert allows(vocabulary, tokenizer, use, '{"ok": true}', text_schema=schema)
    assert allows(vocabulary, tokenizer, use, calls(PARIS), text_schema=schema)
    assert not allows(vocabulary, tokenizer, use, "It is sunny.", text_schema=schema)


def test_with_none_only_text_that_begins_no_call(
    vocabulary: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    none = ToolUse((WEATHER,), choice="none")
    assert allows(vocabulary, tokenizer, none, "It is sunny.")
    assert not allows(vocabulary, tokenizer, none, calls(PARIS))


def test_nothing_is_held_where_no_tool_is_described_nor_for_auto_over_http() -> None:
    assert tool_lark(ToolUse(())) is None
    params = SamplingParams(64)
    assert held_to_tools(params, ToolUse(()), remote=False) is params
    assert held_to_tools(params, ToolUse((WEATHER,), choice="none"), remote=True) is params
    assert held_to_tools(params, ToolUse((WEATHER,)), remote=True) is params
    forced = held_to_tools(params, ToolUse((WEATHER,), choice="required"), remote=True)
    assert forced.response_format is not None and forced.response_format.lark is None

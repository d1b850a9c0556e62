"""Structured output's grammar (``engine/grammar.py``) on the embedded Gemma 3's tokenizer and
the response formats of ``bench/schemas.json``: each format's valid instance is allowed token by
token, its invalid one refused where it breaks the schema, the stop tokens (and every other
special token) only once the JSON is complete, and a schema llguidance cannot enforce is refused
with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from wschat.server.engine import SchemaRefused
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.grammar import (
    GrammarCompiler,
    GrammarMatcher,
    ResponseFormat,
)
from wschat.server.engine.grammar_vocab import llg_tokenizer, tokenizer_json_of
from wschat.server.engine.local.grammar_mask import allocate_bitmask, token_allowed
from wschat.server.engine.openai.tokenizer import embedded_tokenizer

SCHEMAS = json.loads((Path(__file__).parents[2] / "bench" / "schemas.json").read_text())
FORMATS = {entry["name"]: entry for entry in SCHEMAS["formats"]}
UNCOMPILABLE = {entry["name"]: entry["schema"] for entry in SCHEMAS["uncompilable"]}
VOCAB = 262_144
STOP_IDS = (1, 106)  # <eos>, <end_of_turn>


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(embedded_tokenizer(default_cache_dir())))


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, VOCAB, STOP_IDS)


@pytest.fixture(scope="module")
def special(tokenizer: Tokenizer) -> torch.Tensor:
    added = tokenizer.get_added_tokens_decoder()
    return torch.tensor(sorted(i for i, token in added.items() if token.special))


def response_format(name: str) -> ResponseFormat:
    spec = FORMATS[name]["response_format"]
    if spec["type"] == "json_object":
        return ResponseFormat()
    return ResponseFormat(spec["json_schema"]["schema"], spec["json_schema"]["strict"])


def ids_of(tokenizer: Tokenizer, value: Any) -> list[int]:
    text = json.dumps(value, ensure_ascii=False)
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def allowed_specials(mask: torch.Tensor, special: torch.Tensor) -> list[int]:
    bits = (mask[0, special // 32] >> (special % 32)) & 1
    return list(special[bits.bool()].tolist())


def allowed_count(mask: torch.Tensor) -> int:
    bytes_ = mask.view(torch.uint8).long()
    return int(sum(((bytes_ >> bit) & 1).sum() for bit in range(8)))


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_formats_matcher_allows_its_valid_instance_and_a_stop_token_only_at_the_end(
    name: str, compiler: GrammarCompiler, tokenizer: Tokenizer, special: torch.Tensor
) -> None:
    matcher = compiler.compile(response_format(name)).matcher()
    mask = allocate_bitmask(1, VOCAB)
    for token in ids_of(tokenizer, FORMATS[name]["valid"]):
        assert not matcher.is_complete
        matcher.allowed_mask(mask[0])
        assert token_allowed(mask, 0, token), tokenizer.decode([token])
        assert allowed_specials(mask, special) == []  # no stop, no control token mid-JSON
        matcher.advance(token)
    # the JSON is whole: a stop token alone may follow (no trailing whitespace), so a reply
    # can end at its closing brace
    assert matcher.is_complete and matcher.is_finished
    matcher.allowed_mask(mask[0])
    assert allowed_specials(mask, special) == list(STOP_IDS)
    assert allowed_count(mask) == len(STOP_IDS)
    matcher.advance(STOP_IDS[1])


# Where each invalid instance breaks its schema: the text before the refused token, and the token.
REFUSED_AT = {
    "person": ('{"name": "Ada Lovelace", "age": 15', "1"),  # age 151 > maximum 150
    "order": ('{"status": "', "lost"),  # not in the enum
    "weather": ('{"temperature_c": 6', "1"),  # 61.5 > maximum 60
    "event": ('{"title": "Café meetup in Zürich", "date": "2026', "/"),  # the date's pattern
    "classification": ('{"label": "', "mixed"),
    "shape": ('{"shape": {"kind": "', "triangle"),  # neither branch of the anyOf
    "recipe": ('{"title": "Pancakes", "servings": 1', "3"),  # 13 > maximum 12
    "contact": ('{"', "email"),  # "name" is required and comes first
    "task": ('{"title": "Write the report", "done": false, "due": null, "priority": ', "7"),
    "tool_call": ('{"name": "get_', "time"),  # the const name
    "json_object": ("", "["),  # an array, not an object
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_formats_matcher_refuses_the_token_that_breaks_its_schema(
    name: str, compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    matcher = compiler.compile(response_format(name)).matcher()
    mask = allocate_bitmask(1, VOCAB)
    ids = ids_of(tokenizer, FORMATS[name]["invalid"])
    taken: list[int] = []
    for token in ids:
        matcher.allowed_mask(mask[0])
        if not token_allowed(mask, 0, token):
            break
        matcher.advance(token)
        taken.append(token)
    assert len(taken) < len(ids), "every token of the invalid instance was allowed"
    assert (tokenizer.decode(taken), tokenizer.decode([token])) == REFUSED_AT[name]
    with pytest.raises(ValueError, match=rf"^token {token} breaks the grammar: "):
        matcher.advance(token)
    assert not matcher.is_complete


REASONS = {
    "ref_to_nowhere": "Pointer '/$defs/missing' does not exist",
    "lookahead_pattern": "look-around, including look-ahead and look-behind, is not supported",
    "backreference_pattern": "backreferences are not supported",
    "unknown_type": "Invalid type: strnig",
    "minimum_over_maximum": "Unsatisfiable schema: required property 'v' is unsatisfiable",
    "unique_items": 'Unimplemented keys: ["uniqueItems"]',
    "not": 'Unimplemented keys: ["not"]',
}


@pytest.mark.parametrize("name", list(UNCOMPILABLE))
def test_a_schema_llguidance_cannot_enforce_is_refused_with_its_reason(
    name: str, compiler: GrammarCompiler
) -> None:
    with pytest.raises(SchemaRefused) as refused:
        compiler.compile(ResponseFormat(UNCOMPILABLE[name], strict=True))
    assert refused.value.message.startswith("response_format: the schema cannot be enforced: ")
    assert REASONS[name] in refused.value.message


def test_without_strict_a_keyword_llguidance_does_not_implement_is_left_out(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    matcher = compiler.compile(ResponseFormat(UNCOMPILABLE["unique_items"])).matcher()
    for token in ids_of(tokenizer, {"v": [1, 1]}):  # a repeat uniqueItems would refuse
        matcher.advance(token)
    assert matcher.is_complete


def test_an_empty_schema_allows_any_json_value_where_json_object_allows_objects_alone(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    array = ids_of(tokenizer, [1, 2])
    any_value = compiler.compile(ResponseFormat({}, strict=True)).matcher()
    for token in array:
        any_value.advance(token)
    assert any_value.is_complete
    with pytest.raises(ValueError, match=rf"^token {array[0]} breaks the grammar: "):
        compiler.compile(ResponseFormat()).matcher().advance(array[0])


def test_a_compiled_grammar_is_kept_per_schema_whatever_its_key_order(
    tokenizer: Tokenizer,
) -> None:
    compiler = GrammarCompiler(tokenizer, VOCAB, STOP_IDS, cached=2)
    a = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    same = {"required": ["x"], "properties": {"x": {"type": "integer"}}, "type": "object"}
    first = compiler.compile(ResponseFormat(a, strict=True))
    assert compiler.compile(ResponseFormat(same, strict=True)) is first
    assert compiler.compile(ResponseFormat(a, strict=False)) is not first
    compiler.compile(ResponseFormat())  # a third: the least recently used goes
    assert compiler.compile(ResponseFormat(a, strict=True)) is not first


def test_each_reply_gets_its_own_matcher(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    compiled = compiler.compile(response_format("tool_call"))
    one, other = compiled.matcher(), compiled.matcher()
    for token in ids_of(tokenizer, FORMATS["tool_call"]["valid"]):
        one.advance(token)
    assert one.is_complete and not other.is_complete


def test_the_mask_must_be_one_contiguous_int32_row_of_the_vocabulary(
    compiler: GrammarCompiler,
) -> None:
    matcher: GrammarMatcher = compiler.compile(ResponseFormat()).matcher()
    with pytest.raises(ValueError, match=r"^the mask must hold 8192 words$"):
        matcher.allowed_mask(allocate_bitmask(1, VOCAB - 64)[0])
    with pytest.raises(ValueError, match=r"^the mask must be a contiguous int32 buffer$"):
        matcher.allowed_mask(torch.zeros(VOCAB // 32, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^the mask must be a contiguous int32 buffer$"):
        matcher.allowed_mask(allocate_bitmask(2, VOCAB * 2)[:, ::2][0])


def test_the_vocabulary_read_here_is_llguidances_own_reading(tokenizer: Tokenizer) -> None:
    import llguidance

    ours = llg_tokenizer(tokenizer, VOCAB, STOP_IDS)
    theirs = llguidance.LLTokenizer(
        tokenizer_json_of(tokenizer), n_vocab=VOCAB, eos_token=list(STOP_IDS), slices=[]
    )
    differ = [
        i
        for i in range(VOCAB)
        if ours.decode_bytes([i]) != theirs.decode_bytes([i])
        or ours.is_special_token(i) != theirs.is_special_token(i)
    ]
    assert differ == []
    assert ours.eos_tokens == list(STOP_IDS)

"""The structured-output scenario's pure parts: each reply judged (parses, matches its schema),
the shares they add up to, the targets and the table."""

from __future__ import annotations

from typing import Any

import jsonschema

from bench import structured

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def done(text: str, reason: str = "stop", tokens: int = 7) -> dict[str, Any]:
    return {"text": text, "reason": reason, "usage": {"completion_tokens": tokens}}


def test_a_reply_is_judged_by_parsing_it_then_validating_it_against_its_schema() -> None:
    def judge(text: str) -> dict[str, Any]:
        return structured.judged("f", "q", done(text), SCHEMA, jsonschema.validate)

    assert (judge('{"a": 1}')["parses"], judge('{"a": 1}')["valid"]) == (True, True)
    wrong = judge('{"a": "x"}')
    assert (wrong["parses"], wrong["valid"]) == (True, False)
    assert wrong["why_invalid"] == "'x' is not of type 'integer'"
    cut = judge('{"a": 1')
    assert (cut["parses"], cut["valid"]) == (False, False)


def test_every_format_of_the_schemas_file_has_five_prompts() -> None:
    formats = structured.formats()
    assert sorted(formats) == sorted(structured.PROMPTS)
    assert len(formats) == 10 and {len(p) for p in structured.PROMPTS.values()} == {5}


def test_the_targets_and_table_name_the_shares_and_ratios() -> None:
    replies = [
        structured.judged("f", "q", done('{"a": 1}'), SCHEMA, jsonschema.validate),
        structured.judged("f", "q", done('{"a"', "length", 256), SCHEMA, jsonschema.validate),
    ]
    result = {
        "engine": "batched",
        "replies": replies,
        **structured.validity(replies),
        "decode": {
            "1": {"schema_tokens_per_s": 19.0, "plain_tokens_per_s": 20.0, "ratio": 0.95},
            "8": {"schema_tokens_per_s": 80.0, "plain_tokens_per_s": 100.0, "ratio": 0.8},
        },
        "beside": {
            "beside_tokens_per_s": 9.7,
            "plain_tokens_per_s": 10.0,
            "again_tokens_per_s": 9.9,
            "ratio": 0.97,
            "again_ratio": 0.99,
            "rows": 7,
        },
        "logprobs": {
            "logprobs_tokens_per_s": 19.5,
            "plain_tokens_per_s": 20.0,
            "ratio": 0.975,
            "top": 5,
        },
    }
    assert result["valid_share"] == result["parse_share"] == 0.5
    assert result["reasons"] == {"stop": 1, "length": 1}
    met = [row.met for row in structured.targets(result)]
    assert met == [False, True, False, True, True]
    text = "\n".join(str(part) for part in structured.report(result).parts)
    assert "2 replies: 50% parse and validate (50% parse); ended {'stop': 1, 'length': 1}" in text
    assert "(0.80x)" in text and "logprobs 5" in text
    assert (
        "the 7 plain rows at 9.7 tokens/s each, beside 8 plain 10.0 (0.97x; 8 plain again: "
        "0.99x)" in text
    )
    # a result from before the part: its other targets, no row for it
    del result["beside"]
    assert [row.met for row in structured.targets(result)] == [False, True, False, True]

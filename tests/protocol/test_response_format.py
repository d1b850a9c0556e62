"""``params.response_format``'s rules (protocol/response_format.py; PROTOCOL.md "params"): each
broken rule is ``InvalidParams`` with its exact message; what holds is kept, equal by its
schema's content whatever its keys' order, and goes back to the wire as it came."""

from __future__ import annotations

from typing import Any

import pytest
from wschat.protocol import InvalidParams, parse_params
from wschat.protocol.response_format import MAX_NAME_CHARS, OutputFormat, parse_response_format

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"type": "text"}, OutputFormat()),
        ({"type": "json_object"}, OutputFormat("json_object")),
        (
            {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            OutputFormat("json_schema", SCHEMA),
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "n", "description": "d", "schema": SCHEMA, "strict": True},
            },
            OutputFormat("json_schema", SCHEMA, True, "n"),
        ),
    ],
)
def test_a_format_that_holds_is_kept_and_goes_back_to_the_wire(
    value: dict[str, Any], expected: OutputFormat
) -> None:
    parsed = parse_response_format(value)
    assert parsed == expected
    assert parsed.constrained is (value["type"] != "text")
    wire = parsed.to_wire()
    assert parse_response_format(wire) == parsed
    if value["type"] == "json_schema":
        assert wire["json_schema"]["schema"] == SCHEMA and "description" not in wire["json_schema"]


def test_two_schemas_equal_but_for_their_keys_order_are_one_format() -> None:
    reordered = {"properties": {"a": {"type": "integer"}}, "type": "object"}
    one = OutputFormat("json_schema", SCHEMA)
    other = OutputFormat("json_schema", reordered)
    assert one == other and hash(one) == hash(other)
    assert one != OutputFormat("json_schema", {"type": "object"})


WHERE = "response_format.json_schema"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("json_object", "response_format must be a map"),
        ({"type": "json_object", "strict": True}, "unknown key 'strict' in response_format"),
        ({"type": "xml"}, "response_format.type must be one of text, json_object, json_schema"),
        ({}, "response_format.type must be one of text, json_object, json_schema"),
        (
            {"type": "json_object", "json_schema": {"schema": SCHEMA}},
            "response_format.json_schema goes with type json_schema",
        ),
        ({"type": "json_schema"}, f"{WHERE} must be a map"),
        ({"type": "json_schema", "json_schema": [SCHEMA]}, f"{WHERE} must be a map"),
        (
            {"type": "json_schema", "json_schema": {"schema": SCHEMA, "format": "x"}},
            f"unknown key 'format' in {WHERE}",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": 1, "schema": SCHEMA}},
            f"{WHERE}.name must be a string",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "n" * 65, "schema": SCHEMA}},
            f"{WHERE}.name must be at most {MAX_NAME_CHARS} characters",
        ),
        (
            {"type": "json_schema", "json_schema": {"description": 1, "schema": SCHEMA}},
            f"{WHERE}.description must be a string",
        ),
        (
            {"type": "json_schema", "json_schema": {"strict": "yes", "schema": SCHEMA}},
            f"{WHERE}.strict must be a boolean",
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": True}},
            f"{WHERE}.schema must be a map (a JSON schema)",
        ),
    ],
)
def test_each_broken_rule_is_invalid_params_with_its_message(value: Any, message: str) -> None:
    with pytest.raises(InvalidParams) as raised:
        parse_params({"response_format": value})
    assert raised.value.message == message

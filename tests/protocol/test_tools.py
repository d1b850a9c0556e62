"""The tool fields' rules (protocol/tools.py; PROTOCOL.md "params" ``tools``, ``tool_choice``,
section 5 ``tool_results``): each broken rule is ``InvalidParams`` with its exact message, a
schema past a cap is refused without reading past it, and what holds is kept exactly."""

from __future__ import annotations

from typing import Any

import pytest
from wschat.protocol import InvalidParams, ToolChoice, ToolResult, ToolSpec, parse_params
from wschat.protocol.tools import (
    MAX_DESCRIPTION_CHARS,
    MAX_SCHEMA_CHARS,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_VALUES,
    MAX_TOOLS,
    parse_results,
)

F: dict[str, Any] = {"name": "f"}


def nested(depth: int) -> dict[str, Any]:
    """A schema of ``depth`` maps, one in the other."""
    schema: dict[str, Any] = {}
    for _ in range(depth - 1):
        schema = {"items": schema}
    return schema


def test_tools_and_a_named_choice_that_hold_are_kept_exactly() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    params = parse_params(
        {
            "tools": [
                {"name": "get-weather_2", "description": "d", "parameters": schema},
                {"name": "f", "parameters": nested(MAX_SCHEMA_DEPTH - 2)},
            ],
            "tool_choice": {"name": "f"},
        }
    )
    assert params.tools == (
        ToolSpec("get-weather_2", "d", schema),
        ToolSpec("f", "", nested(MAX_SCHEMA_DEPTH - 2)),
    )
    assert params.tool_choice == ToolChoice("named", "f")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tools": {"name": "f"}}, "tools must be a list of maps"),
        ({"tools": [F] * (MAX_TOOLS + 1)}, f"tools takes at most {MAX_TOOLS} tools"),
        ({"tools": ["f"]}, "tools[0] must be a map"),
        ({"tools": [F, {"name": "g", "strict": True}]}, "unknown key 'strict' in tools[1]"),
        (
            {"tools": [{"name": "get weather"}]},
            "tools[0].name must be 1 to 64 letters, digits, _ or -",
        ),
        ({"tools": [{"name": "x" * 65}]}, "tools[0].name must be 1 to 64 letters, digits, _ or -"),
        ({"tools": [{"name": 7}]}, "tools[0].name must be a string"),
        (
            {"tools": [{"name": "f", "description": "d" * (MAX_DESCRIPTION_CHARS + 1)}]},
            f"tools[0].description is over {MAX_DESCRIPTION_CHARS} characters",
        ),
        (
            {"tools": [{"name": "f", "parameters": [{"type": "object"}]}]},
            "tools[0].parameters must be a map (a JSON schema)",
        ),
        ({"tools": [F, {"name": "g"}, F]}, "tools must have distinct names"),
        (
            {"tools": [{"name": "f", "parameters": nested(MAX_SCHEMA_DEPTH - 1)}]},
            f"tools is nested more than {MAX_SCHEMA_DEPTH} deep",
        ),
        (
            {"tools": [{"name": "f", "parameters": {"enum": list(range(MAX_SCHEMA_VALUES))}}]},
            f"tools holds more than {MAX_SCHEMA_VALUES} values",
        ),
        (
            {"tools": [{"name": "f", "parameters": {"enum": [[0, 0]] * (MAX_SCHEMA_VALUES // 3)}}]},
            f"tools holds more than {MAX_SCHEMA_VALUES} values",
        ),
        (
            {"tools": [{"name": "f", "parameters": {"enum": ["x" * 4096] * 16}}]},
            f"tools holds more than {MAX_SCHEMA_CHARS} characters",
        ),
        (
            {"tool_choice": {"name": "f", "strict": True}},
            "tool_choice as a map names a tool: {name}",
        ),
        ({"tool_choice": {}}, "tool_choice as a map names a tool: {name}"),
        (
            {"tool_choice": {"name": "a b"}},
            "tool_choice.name must be 1 to 64 letters, digits, _ or -",
        ),
        ({"tool_choice": "any"}, "tool_choice must be one of auto, none, required, or {name}"),
        ({"tool_choice": 1}, "tool_choice must be one of auto, none, required, or {name}"),
    ],
)
def test_each_broken_tool_rule_is_invalid_params_with_its_message(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidParams) as raised:
        parse_params(params)
    assert raised.value.message == message


def test_results_that_hold_are_kept_in_their_order() -> None:
    results = parse_results([{"call_id": "b", "content": "1"}, {"call_id": "a", "content": ""}])
    assert results == (ToolResult("b", "1"), ToolResult("a", ""))


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ({"call_id": "c", "content": "x"}, "results must be a non-empty list of maps"),
        ([], "results must be a non-empty list of maps"),
        (
            [{"call_id": f"c{n}", "content": "x"} for n in range(MAX_TOOLS + 1)],
            f"results takes at most {MAX_TOOLS} results",
        ),
        ([{"call_id": "c", "content": "x"}, "c"], "results[1] must be a map"),
        ([{"call_id": "", "content": "x"}], "results[0].call_id must be 1 to 64 characters"),
        ([{"call_id": "c" * 65, "content": "x"}], "results[0].call_id must be 1 to 64 characters"),
        ([{"call_id": 1, "content": "x"}], "results[0].call_id must be a string"),
        ([{"call_id": "c"}], "results[0].content must be a string"),
        ([{"call_id": "c", "content": "x"}] * 2, "results must answer each call once"),
    ],
)
def test_each_broken_results_rule_is_invalid_params_with_its_message(
    results: Any, message: str
) -> None:
    with pytest.raises(InvalidParams) as raised:
        parse_results(results)
    assert raised.value.message == message

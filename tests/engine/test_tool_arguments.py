"""A call's arguments checked against its tool's schema: the rule every engine's calls keep,
with the client's patterns held to a time budget (engine/tool_arguments.py)."""

from __future__ import annotations

import time

import pytest
from wschat.server.engine.errors import CallArgumentsInvalid
from wschat.server.engine.tool_arguments import PATTERN_BUDGET_S, check_arguments

CITY = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"}}}
# backtracks without end against a near miss, in Python's re as in regex
RUNAWAY = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^(a|a)*$"}}}


def test_arguments_that_match_their_pattern_pass() -> None:
    check_arguments("get_weather", CITY, {"city": "Paris"})


def test_arguments_that_miss_their_pattern_name_the_pattern_and_where() -> None:
    with pytest.raises(CallArgumentsInvalid) as caught:
        check_arguments("get_weather", CITY, {"city": "paris"})
    assert str(caught.value) == (
        "the engine called get_weather with arguments that do not match its parameters: "
        "'paris' does not match '^[A-Z][a-z]+$' (at city)"
    )


def test_pattern_properties_match_keys_and_check_their_values() -> None:
    schema = {"type": "object", "patternProperties": {"^n_": {"type": "integer"}}}
    check_arguments("count", schema, {"n_a": 1, "other": "x"})
    with pytest.raises(CallArgumentsInvalid, match=r"'x' is not of type 'integer' \(at n_a\)"):
        check_arguments("count", schema, {"n_a": "x"})


def test_a_pattern_that_backtracks_without_end_fails_the_call_within_its_budget() -> None:
    started = time.monotonic()
    with pytest.raises(CallArgumentsInvalid, match=r"pattern '\^\(a\|a\)\*\$' took too long"):
        check_arguments("get_weather", RUNAWAY, {"city": "a" * 64 + "!"})
    # a bound far above the budget (the match stops at its next check of the clock), and far
    # below the hours Python's re takes on this string
    assert time.monotonic() - started < PATTERN_BUDGET_S + 2.0


def test_a_pattern_that_is_no_pattern_fails_the_call_as_a_schema_that_is_none() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "pattern": "("}}}
    with pytest.raises(CallArgumentsInvalid, match="they are not a JSON schema"):
        check_arguments("get_weather", schema, {"city": "Paris"})

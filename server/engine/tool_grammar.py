"""The grammar a reply that may call tools is held to (tools.py lays the calls out), in
llguidance's Lark syntax, each call's object a JSON schema (``%json``) written as ``json.dumps``
writes JSON (grammar.py says why):

    forced (``required``, ``{name}``)   start: calls
    auto                                start: calls | TEXT
    none (tools described, no call)     start: TEXT
    auto, a response format's schema    start: one JSON value: the calls' object or that schema
    calls: OPEN call (", " call)* "]}"  OPEN: a space or line break the format may leave, then
                                        ``{"tool_calls": [``; one call only without
                                        ``parallel_tool_calls``
    call: %json {name: the tool's name (const), arguments: its parameters' schema}, one
          alternative per tool it may call
    TEXT: any text that does not begin a call

So a forced reply is a valid call to a tool it may call, its arguments matching that tool's
schema; an ``auto`` reply is text, or once it begins a call, such a call to its end. After the
last ``]}`` only a token that ends the reply may come.

``held_to_tools`` puts it on a reply's sampling params: a forced reply as a JSON schema of the
whole calls' object (every engine takes one: over HTTP the engine enforces it, dialect.py), an
``auto`` (or ``none``) reply as the Lark grammar above, which only the engines in this process
take; an engine over HTTP is sent no grammar for one: an ``auto`` reply's calls are read as they
come (tools.py ``read_calls``), and a ``none`` reply is text whatever it says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .base import SamplingParams
from .grammar import JSON_OPTIONS, ResponseFormat
from .tools import CALLS_KEY, ToolUse, described

OPEN = r'OPEN: /[ \n]?\{"' + CALLS_KEY + r'": \[/'
NOT_A_CALL = r'TEXT: /(?s:.*)/ & ~/[ \n]?\{"' + CALLS_KEY + r'"(?s:.*)/'


def call_schema(use: ToolUse) -> dict[str, Any]:
    """One call's object: the name of a tool the reply may call and that tool's arguments."""
    options = []
    for tool in use.callable():
        properties = {"name": {"const": tool.name}, "arguments": described(tool)["parameters"]}
        options.append(
            {
                "type": "object",
                "properties": properties,
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": JSON_OPTIONS}


def _calls_object(use: ToolUse) -> dict[str, Any]:
    """The whole ``{"tool_calls": [...]}`` object as a schema."""
    items = {k: v for k, v in call_schema(use).items() if k != "x-guidance"}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not use.parallel:
        array["maxItems"] = 1
    properties = {CALLS_KEY: array}
    return {
        "type": "object",
        "properties": properties,
        "required": [CALLS_KEY],
        "additionalProperties": False,
    }


def tool_lark(use: ToolUse, text_schema: Mapping[str, Any] | None = None) -> str | None:
    """The Lark grammar for a reply under ``use`` (None: no tool is described, nothing to
    hold); ``text_schema``: where an ``auto`` reply that is no call must be this JSON (a
    response format's), else any text."""
    if not use.described:
        return None
    if not use.may_call:
        return "\n".join(["start: TEXT", NOT_A_CALL])
    more = ' (", " call)*' if use.parallel else ""
    rules = [
        f'calls: OPEN call{more} "]}}"',
        OPEN,
        f"call: %json {json.dumps(call_schema(use))}",
    ]
    if use.forced:
        return "\n".join(["start: calls", *rules])
    if text_schema is not None:
        # one JSON grammar: llguidance's lexer does not take OPEN beside another JSON value
        either = {"anyOf": [_calls_object(use), dict(text_schema)], "x-guidance": JSON_OPTIONS}
        return f"start: answer\nanswer: %json {json.dumps(either)}"
    return "\n".join(["start: calls | TEXT", *rules, NOT_A_CALL])


def held_to_tools(params: SamplingParams, use: ToolUse | None, *, remote: bool) -> SamplingParams:
    """``params`` with the format a reply under ``use`` is held to (the module docstring);
    as they are where no tool is described, and for an ``auto`` reply of an engine over HTTP."""
    if use is None or not use.described:
        return params
    if use.forced:
        return replace(params, response_format=ResponseFormat(_calls_object(use)))
    if remote or (not use.may_call and params.response_format is not None):
        return params  # a response format's JSON begins no call of its own accord
    text = params.response_format
    schema = None if text is None else dict(text.schema or {"type": "object"})
    return replace(params, response_format=ResponseFormat(lark=tool_lark(use, schema)))

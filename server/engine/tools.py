"""Tool calls, for every engine and every door: the tools a reply may call (``ToolUse``), how a
conversation tells the model about them and carries their calls and results as text, and how a
reply's text is read back as calls (``read_calls``).

Gemma 3's chat template has no tool syntax (nor has the transcript a base model continues), so
every prompt format uses one fallback, llama.cpp's "generic" format made stricter, which each
format lays out as ordinary turns (formats.py):

- the tools are described after the system prompt (``ToolUse.prompt_text``): one JSON object per
  tool, its ``parameters`` the JSON schema of its arguments, and how to call them;
- a reply that calls tools is one JSON object and nothing else, written as ``json.dumps`` writes
  it: ``{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}``; a reply
  that begins so and is not such an object, naming offered tools, is read as text;
- the results come back as the next user turn's text, one per call in the calls' order:
  ``{"tool_results": [{"name": "get_weather", "content": ...}]}``, a result that is JSON as its
  value, any other as a string; then the model replies again, within the same exchange.

A call's id is the server's (``call_`` and a per-reply seed and the call's place), never the
model's: the model writes names and arguments only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wschat.protocol.tools import ToolChoice, ToolResult, ToolSpec

# What a reply that calls tools starts with (after a space or a line break the format may leave)
CALLS_KEY = "tool_calls"
RESULTS_KEY = "tool_results"
CALLS_OPENING = '{"' + CALLS_KEY + '": ['
AUTO, NONE, REQUIRED, NAMED = "auto", "none", "required", "named"


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A call a reply made: its id (the server's), the function's name, its arguments as JSON
    text (an object)."""

    id: str
    name: str
    arguments: str

    def to_data(self) -> list[str]:
        return [self.id, self.name, self.arguments]

    @classmethod
    def of_data(cls, data: Any) -> FunctionCall:
        """``to_data``'s list; ``ValueError`` when it is not one."""
        if not (
            isinstance(data, list) and len(data) == 3 and all(isinstance(s, str) for s in data)
        ):
            raise ValueError("not an exported tool call")
        return cls(*data)


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools a turn offers and how it may use them: ``choice`` is ``auto`` (the model says
    text or calls), ``none`` (no call: the tools are described all the same, so the prompt, and
    the cached state, stay those of the turns that may call them), ``required`` (at least one
    call) or ``named`` (a call to ``name``); ``parallel``: several calls in one reply."""

    tools: tuple[ToolSpec, ...]
    choice: str = AUTO
    name: str | None = None
    parallel: bool = True
    # the tools' description as the prompt carries it: what ids are cached under
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.prompt_text() if self.described else "")

    @property
    def described(self) -> bool:
        """Whether the model is told about the tools."""
        return bool(self.tools)

    @property
    def may_call(self) -> bool:
        """Whether the reply may call them: not under ``none``."""
        return self.described and self.choice != NONE

    @property
    def forced(self) -> bool:
        """The reply must be a call: ``required``, or ``named``."""
        return self.may_call and self.choice in (REQUIRED, NAMED)

    @classmethod
    def of(
        cls, tools: tuple[ToolSpec, ...] | None, choice: ToolChoice | None, parallel: bool | None
    ) -> ToolUse | None:
        """A prompt's merged params as the use of its tools; None where none is offered."""
        if not tools:
            return None
        choice = choice or ToolChoice()
        return cls(tools, choice.mode, choice.name, True if parallel is None else parallel)

    def callable(self) -> tuple[ToolSpec, ...]:
        """The tools a call may name."""
        if self.choice == NAMED:
            return tuple(t for t in self.tools if t.name == self.name)
        return self.tools if self.may_call else ()

    def prompt_text(self) -> str:
        """The tools described, as the prompt carries them after the system prompt."""
        lines = [
            "You can call these tools. Each line is one tool; its parameters are the JSON schema"
            " of its arguments.",
            *(dumps(described(tool)) for tool in self.tools),
            "To call tools, reply with this JSON object and nothing else: "
            + dumps({CALLS_KEY: [{"name": "<tool name>", "arguments": {"<name>": "<value>"}}]}),
            "Their results come back as "
            + dumps({RESULTS_KEY: [{"name": "<tool name>", "content": "<result>"}]})
            + "; then answer with them.",
        ]
        return "\n".join(lines)


def described(tool: ToolSpec) -> dict[str, Any]:
    """A tool as the prompt describes it: its parameters an object's schema where none came."""
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    out["parameters"] = dict(tool.parameters or {"type": "object"})
    return out


def dumps(value: Any) -> str:
    """JSON as the prompts and the grammars write it: ``json.dumps``'s separators, UTF-8 as is."""
    return json.dumps(value, ensure_ascii=False)


def calls_text(content: str, calls: Sequence[FunctionCall]) -> str:
    """A reply that called tools, as text (one a client sends back, whose ids are unknown):
    its text, if any, then the calls' JSON object."""
    body = dumps({CALLS_KEY: [{"name": c.name, "arguments": _value(c.arguments)} for c in calls]})
    return f"{content}\n\n{body}" if content else body


def results_text(calls: Sequence[FunctionCall], results: Sequence[ToolResult]) -> str:
    """The results of ``calls``, one per call in their order, as the next user turn's text."""
    content = {result.call_id: result.content for result in results}
    return dumps({RESULTS_KEY: [{"name": c.name, "content": _value(content[c.id])} for c in calls]})


def _value(text: str) -> Any:
    """JSON text as its value (a tool's result is often JSON); any other text as a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


class CallsInvalid(ValueError):
    """A reply that began a call whose JSON does not parse, or names no offered tool."""


def call_id(seed: str, index: int) -> str:
    return f"call_{seed}{index}"


_DECODER = json.JSONDecoder()


def next_call(text: str, at: int, use: ToolUse, seed: str, index: int) -> tuple[FunctionCall, int]:
    """The call whose object starts at ``at`` (after the separators a calls' list may put
    there) and where it ends; ``CallsInvalid`` where no whole call to a tool of ``use`` does."""
    while at < len(text) and text[at] in ", \n":
        at += 1
    try:
        item, end = _DECODER.raw_decode(text, at)
    except ValueError:
        raise CallsInvalid("no whole call") from None
    return offered_call(item, use, seed, index), end


def offered_call(item: Any, use: ToolUse, seed: str, index: int) -> FunctionCall:
    """A call's object as the call it makes: ``CallsInvalid`` where it names no tool ``use``
    may call or its arguments are no object; ``CallArgumentsInvalid`` where they do not match
    the tool's schema (tool_arguments.py)."""
    name = item.get("name") if isinstance(item, dict) else None
    arguments = item.get("arguments") if isinstance(item, dict) else None
    tool = next((t for t in use.callable() if t.name == name), None)
    if tool is None or not isinstance(arguments, dict):
        raise CallsInvalid(f"the reply's call {index} names no offered tool with its arguments")
    # imported here: the engine package loads without the server's extras (`wschat-server
    # --help` on a bare install), and jsonschema is one of them
    from .tool_arguments import check_arguments

    check_arguments(tool.name, tool.parameters, arguments)
    return FunctionCall(call_id(seed, index), tool.name, dumps(arguments))


def read_calls(text: str, use: ToolUse | None, seed: str) -> tuple[FunctionCall, ...] | None:
    """The calls a whole reply makes (None: it is text, not a call); ``CallsInvalid`` for one
    that begins a call it does not complete, or calls a tool ``use`` does not offer;
    ``CallArgumentsInvalid`` for a call whose arguments do not match its tool's schema."""
    if use is None or not use.may_call:
        return None
    stripped = text.strip()
    if not stripped.startswith(CALLS_OPENING):
        return None
    try:
        value = json.loads(stripped)
    except ValueError as e:
        raise CallsInvalid(f"the reply's tool calls are not JSON: {e}") from None
    items = value.get(CALLS_KEY) if isinstance(value, dict) else None
    if not isinstance(items, list) or not items or len(value) != 1:
        raise CallsInvalid(f"the reply's tool calls are not a list of calls: {stripped[:80]}")
    calls = [offered_call(item, use, seed, n) for n, item in enumerate(items)]
    if len(calls) > 1 and not use.parallel:
        raise CallsInvalid("the reply makes several calls; parallel_tool_calls is false")
    return tuple(calls)

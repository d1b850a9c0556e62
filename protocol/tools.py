"""Tools on the wire (PROTOCOL.md "Tool calls"): ``params.tools``, ``params.tool_choice`` and a
``tool_results`` frame's results, each checked here before anything is built from it.

    params.tools:        [{name, description?, parameters?}, ...]   at most ``MAX_TOOLS``
    params.tool_choice:  "auto" | "none" | "required" | {name}
    tool_results.results: [{call_id, content}, ...]

A tool's name is 1 to 64 letters, digits, ``_`` or ``-`` (OpenAI's rule), unique in the list;
its ``parameters`` a JSON schema (a map), of which all the tools' together are held to caps
before any grammar is built from them: at most ``MAX_SCHEMA_DEPTH`` levels of maps and lists,
``MAX_SCHEMA_VALUES`` values (each map, list, key, string, number, bool and nil counts one) and
``MAX_SCHEMA_CHARS`` characters in their keys and strings; the walk that counts them stops at the
first cap it passes, so a refused list costs no more than an accepted one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidParams
from .fields import MAX_ID_CHARS, as_str

MAX_TOOLS = 64
MAX_DESCRIPTION_CHARS = 4096
MAX_SCHEMA_DEPTH = 24
MAX_SCHEMA_VALUES = 4096
MAX_SCHEMA_CHARS = 65536
CHOICES = ("auto", "none", "required")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_KEYS = frozenset({"name", "description", "parameters"})


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function a reply may call: its name, what it does, the JSON schema of its arguments
    (None: any object)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = field(default=None, compare=False)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.parameters is not None:
            out["parameters"] = dict(self.parameters)
        return out


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto``, ``none``, ``required``, or ``named``: a call to ``name`` and no other."""

    mode: str = "auto"
    name: str | None = None

    def to_wire(self) -> str | dict[str, str]:
        return {"name": self.name} if self.name is not None else self.mode


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the program that ran a call answered: the call's id and the result as text."""

    call_id: str
    content: str

    def to_wire(self) -> dict[str, str]:
        return {"call_id": self.call_id, "content": self.content}


def parse_tools(value: object) -> tuple[ToolSpec, ...]:
    """``params.tools``, checked, or ``InvalidParams`` naming what is wrong."""
    if type(value) is not list:
        raise InvalidParams("tools must be a list of maps")
    if len(value) > MAX_TOOLS:
        raise InvalidParams(f"tools takes at most {MAX_TOOLS} tools")
    check_schema_size(value, "tools")
    tools: list[ToolSpec] = []
    for n, item in enumerate(value):
        where = f"tools[{n}]"
        if not isinstance(item, Mapping):
            raise InvalidParams(f"{where} must be a map")
        unknown = [k for k in item if k not in _TOOL_KEYS]
        if unknown:
            raise InvalidParams(f"unknown key {unknown[0]!r} in {where}")
        name = tool_name(item.get("name"), f"{where}.name")
        description = item.get("description")
        description = "" if description is None else as_str(description, where, InvalidParams)
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise InvalidParams(f"{where}.description is over {MAX_DESCRIPTION_CHARS} characters")
        parameters = item.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InvalidParams(f"{where}.parameters must be a map (a JSON schema)")
        tools.append(ToolSpec(name, description, None if parameters is None else dict(parameters)))
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise InvalidParams("tools must have distinct names")
    return tuple(tools)


def tool_name(value: object, where: str) -> str:
    name = as_str(value, where, InvalidParams)
    if not _NAME.fullmatch(name):
        raise InvalidParams(f"{where} must be 1 to 64 letters, digits, _ or -")
    return name


def parse_tool_choice(value: object) -> ToolChoice:
    """``params.tool_choice``: one of ``CHOICES``, or ``{name}`` (which the tools must offer:
    the session says, once the prompt's params are merged over its defaults)."""
    if isinstance(value, Mapping):
        if set(value) != {"name"}:
            raise InvalidParams("tool_choice as a map names a tool: {name}")
        return ToolChoice("named", tool_name(value["name"], "tool_choice.name"))
    if value not in CHOICES:
        raise InvalidParams(f"tool_choice must be one of {', '.join(CHOICES)}, or {{name}}")
    return ToolChoice(str(value))


def parse_results(value: object) -> tuple[ToolResult, ...]:
    """A ``tool_results`` frame's results: at least one, each a call's id and its text."""
    if type(value) is not list or not value:
        raise InvalidParams("results must be a non-empty list of maps")
    if len(value) > MAX_TOOLS:
        raise InvalidParams(f"results takes at most {MAX_TOOLS} results")
    results = []
    for n, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise InvalidParams(f"results[{n}] must be a map")
        call_id = as_str(item.get("call_id"), f"results[{n}].call_id", InvalidParams)
        if not 1 <= len(call_id) <= MAX_ID_CHARS:
            raise InvalidParams(f"results[{n}].call_id must be 1 to {MAX_ID_CHARS} characters")
        content = as_str(item.get("content"), f"results[{n}].content", InvalidParams)
        results.append(ToolResult(call_id, content))
    if len({r.call_id for r in results}) != len(results):
        raise InvalidParams("results must answer each call once")
    return tuple(results)


def check_schema_size(schema: Mapping[str, Any] | list[Any], where: str = "schema") -> None:
    """``InvalidParams`` for a schema past a cap (the module docstring), found without reading
    more of it than the cap allows."""
    values = chars = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        values += 1
        if values > MAX_SCHEMA_VALUES:
            raise InvalidParams(f"{where} holds more than {MAX_SCHEMA_VALUES} values")
        if isinstance(node, str):
            chars += len(node)
        elif isinstance(node, Mapping | list):
            if depth > MAX_SCHEMA_DEPTH:
                raise InvalidParams(f"{where} is nested more than {MAX_SCHEMA_DEPTH} deep")
            # each key and each item counts one at least: checked before any is read
            if values + len(node) > MAX_SCHEMA_VALUES:
                raise InvalidParams(f"{where} holds more than {MAX_SCHEMA_VALUES} values")
            if isinstance(node, Mapping):
                values += len(node)  # its keys
                chars += sum(len(k) for k in node if isinstance(k, str))
                stack.extend((v, depth + 1) for v in node.values())
            else:
                stack.extend((v, depth + 1) for v in node)
        if chars > MAX_SCHEMA_CHARS:
            raise InvalidParams(f"{where} holds more than {MAX_SCHEMA_CHARS} characters")

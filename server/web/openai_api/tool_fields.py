"""OpenAI's tool fields read into ours (PROTOCOL.md section 6 ``tools``): a chat completion's
``tools``, ``tool_choice`` and ``parallel_tool_calls`` as a prompt frame's params, an assistant
message's ``tool_calls`` and a ``tool`` message's result. Pure: a refusal is an ``ApiError``
naming the field.

    tools: [{type: "function", function: {name, description?, parameters?, strict?}}]
    tool_choice: "auto" | "none" | "required" | {type: "function", function: {name}}

The deprecated ``functions`` and ``function_call`` are refused (400 ``unsupported``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wschat.protocol import InvalidParams, ToolResult, parse_params

from ...engine import FunctionCall
from .errors import ApiError, invalid, unsupported

_FUNCTION_KEYS = ("name", "description", "parameters")


def tool_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body's tool fields as a prompt frame's params (wire-shaped), each checked as the
    frame's are and refused under OpenAI's name."""
    for name in ("functions", "function_call"):
        if body.get(name) is not None:
            raise unsupported(f"{name} is not supported: use tools", name)
    ours: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        ours["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        ours["tool_choice"] = _choice(choice)
    if body.get("parallel_tool_calls") is not None:
        ours["parallel_tool_calls"] = body["parallel_tool_calls"]
    for name, value in ours.items():
        try:
            parse_params({name: value})
        except InvalidParams as e:
            raise ApiError.of(e, name) from None
    return ours


def _tools(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise invalid("tools must be an array", "tools")
    out: list[Any] = []
    for n, tool in enumerate(value):
        where = f"tools[{n}]"
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise unsupported("only tools of type function are supported", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise invalid("a tool's function must be an object", f"{where}.function")
        out.append({k: function[k] for k in _FUNCTION_KEYS if function.get(k) is not None})
    return out


def _choice(value: Any) -> Any:
    if isinstance(value, Mapping):
        function = value.get("function")
        if value.get("type") != "function" or not isinstance(function, Mapping):
            raise invalid("tool_choice as an object names a function", "tool_choice")
        return {"name": function.get("name")}
    return value


def assistant_calls(message: Mapping[str, Any], param: str) -> list[FunctionCall]:
    """An assistant message's ``tool_calls``: each a function's id, name and arguments (a JSON
    object as text, as the API gave it)."""
    if message.get("function_call") is not None:
        raise unsupported("function_call is not supported: use tool_calls", param)
    value = message.get("tool_calls")
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tool_calls must be an array", f"{param}.tool_calls")
    calls = []
    for n, call in enumerate(value):
        where = f"{param}.tool_calls[{n}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or call.get("type", "function") != "function":
            raise invalid("a tool call must be a function's", where)
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
            raise invalid("a tool call needs its id and its function's name", where)
        if not isinstance(arguments, str):
            raise invalid("a tool call's arguments must be a string (JSON)", where)
        calls.append(FunctionCall(call_id, name, arguments))
    return calls


def tool_result(message: Mapping[str, Any], text: str, param: str) -> ToolResult:
    """A ``tool`` message: the id of the call it answers and its content's text."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid("a tool message needs the tool_call_id it answers", f"{param}.tool_call_id")
    return ToolResult(call_id, text)

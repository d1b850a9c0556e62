"""A Responses API create body (``POST /v1/responses``, or a WebSocket ``response.create``) read
into ours. Pure: no I/O, a refusal is an ``ApiError`` naming the field.

Mapped: ``input`` (a string, or items: messages whose content is a string or ``input_text`` and
``input_image`` parts, an assistant's ``output_text``; ``function_call`` items, a reply's calls;
``function_call_output`` items, their results), ``instructions``, ``max_output_tokens``,
``temperature``, ``top_p``, ``tools`` (functions), ``tool_choice``, ``parallel_tool_calls`` (read
as the chat API reads its own: openai_api/tool_fields.py), ``text.format`` (``text``,
``json_object`` or ``json_schema``: the chat API's ``response_format``, the prompt frame's
``params.response_format``), ``store``, ``previous_response_id``, ``metadata`` (echoed) and, over
HTTP, ``stream``. Refused unless neutral, each naming its field: ``background``,
``conversation``, ``prompt``, ``include``,
``top_logprobs``, ``reasoning``, ``truncation: auto``, ``context_management`` and ``generate:
false``. Any other field (``user``, ``service_tier``, ``prompt_cache_key``, ...) is ignored.

Items and their content parts are counted before any is read (``--max-messages``), and each pass
is linear in the body's size, as for the chat API (openai_api/requests.py, whose readers of a
sampling field and of an image's data URI this uses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from wschat.protocol import (
    GenerationParams,
    InvalidParams,
    OutputFormat,
    ToolResult,
    parse_params,
    parse_response_format,
)

from ...engine import FunctionCall
from ...sessions import ReplySaid, ResultsSaid, Said, UserSaid
from ...settings import Settings
from ..openai_api.errors import invalid, unsupported
from ..openai_api.requests import body_object, data_uri, params_of, shown
from ..openai_api.tool_fields import tool_params

# OpenAI's field -> ours; checked as a prompt frame's params (protocol/params.py)
SAMPLING = {
    "max_output_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
}
# metadata: at most this many pairs, keys and values at most this long (OpenAI's bounds)
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
_SYSTEM_ROLES = frozenset({"system", "developer"})
# what each role's content parts may be
_PARTS = {
    "user": frozenset({"input_text", "input_image"}),
    "assistant": frozenset({"output_text"}),
    "system": frozenset({"input_text"}),
}
# a field refused unless its value is one of these (None: absent or null)
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
    "generate": (None, True),
}
_EMPTY_OR_NULL = ("include", "context_management")


@dataclass(frozen=True, slots=True)
class CreateBody:
    """A create's input (its leading system and developer messages as ``system``), its params as
    a prompt frame's, and the fields its response object echoes."""

    system: str | None
    said: tuple[Said, ...]
    params: GenerationParams
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    # max_output_tokens, temperature, top_p, tools, tool_choice, metadata, text: as sent
    echoed: dict[str, Any]


def create_body(body: Any, settings: Settings) -> CreateBody:
    """``settings``: the most items and content parts (``--max-messages``), the longest reply."""
    body = body_object(body)
    _refuse_unserved(body)
    instructions = _optional_str(body, "instructions")
    previous = _optional_str(body, "previous_response_id")
    system, said = _input(body.get("input"), settings.max_messages)
    params = params_of(body, SAMPLING, settings)
    tools = tool_params(_chat_tool_fields(body))
    if tools:  # checked as they were read (tool_fields.py)
        params = parse_params({**params.to_wire(), **tools})
    format_ = _output_format(body.get("text"))
    if format_ is not None:
        params = replace(params, response_format=format_)
    return CreateBody(
        system,
        said,
        params,
        instructions,
        previous,
        _flag(body, "store", default=True),
        _flag(body, "stream", default=False),
        {
            **{name: body.get(name) for name in (*SAMPLING, "tools", "tool_choice")},
            "metadata": _metadata(body.get("metadata")),
            "text": {"format": body["text"]["format"] if format_ else {"type": "text"}},
        },
    )


def _refuse_unserved(body: Mapping[str, Any]) -> None:
    for name in _EMPTY_OR_NULL:
        if body.get(name):
            raise unsupported(f"{name} is not supported", name)
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        if not any(value is n or (value == n and type(value) is type(n)) for n in neutral):
            raise unsupported(f"{name} {shown(value)} is not supported", name)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and any(v is not None for v in reasoning.values()):
        raise unsupported("reasoning is not supported: the model does not reason", "reasoning")


def _output_format(text: Any) -> OutputFormat | None:
    """``text.format`` read as the chat API's ``response_format`` is, the prompt frame's checks
    (protocol/response_format.py) refusing it under its own name; None: plain text."""
    if text is not None and not isinstance(text, Mapping):
        raise invalid("text must be an object", "text")
    format_ = text.get("format") if text else None
    if format_ is None:
        return None
    if not isinstance(format_, Mapping):
        raise invalid("text.format must be an object", "text.format")
    kind = format_.get("type")
    if kind == "text":
        return None
    fields = {k: v for k, v in format_.items() if k != "type"}
    ours = {"type": kind, "json_schema": fields} if kind == "json_schema" else dict(format_)
    try:
        return parse_response_format(ours)
    except InvalidParams as e:
        message = str(e).replace("response_format.json_schema", "text.format")
        raise invalid(message.replace("response_format", "text.format"), "text.format") from None


def _chat_tool_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body's tool fields in the chat API's shape: a function's fields under ``function``,
    a named ``tool_choice`` likewise."""
    fields: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid("tools must be an array", "tools")
        fields["tools"] = [_chat_tool(tool, f"tools[{n}]") for n, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        if choice.get("type") != "function":
            raise unsupported(f"tool_choice of type {shown(choice.get('type'))}", "tool_choice")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        fields["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = body["parallel_tool_calls"]
    return fields


def _chat_tool(tool: Any, where: str) -> Any:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        raise unsupported(f"a tool of type {shown(kind)} is not supported", f"{where}.type")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _optional_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(f"{name} must be a string", name)
    return value or None


def _flag(body: Mapping[str, Any], name: str, *, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not bool:
        raise invalid(f"{name} must be a boolean", name)
    return value


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > METADATA_PAIRS:
        raise invalid(f"metadata must be an object of at most {METADATA_PAIRS} pairs", "metadata")
    for key, text in value.items():
        if len(key) > METADATA_KEY_CHARS or not isinstance(text, str):
            raise invalid(f"metadata keys are at most {METADATA_KEY_CHARS} characters", "metadata")
        if len(text) > METADATA_VALUE_CHARS:
            message = f"metadata values are strings of at most {METADATA_VALUE_CHARS} characters"
            raise invalid(message, "metadata")
    return dict(value)


def _input(value: Any, most: int) -> tuple[str | None, tuple[Said, ...]]:
    """The input's leading system and developer texts (joined by a blank line) and its other
    messages in order."""
    if isinstance(value, str):
        if not value:
            raise invalid("input must not be empty", "input")
        return None, (UserSaid(value),)
    if not isinstance(value, list) or not value:
        raise invalid("input must be a string or a non-empty list of items", "input")
    _count(value, most)
    system: list[str] = []
    said: list[Said] = []
    for n, item in enumerate(value):
        kind = item.get("type", "message") if isinstance(item, Mapping) else None
        if kind in _TOOL_ITEMS:
            said.append(_TOOL_ITEMS[kind](item, f"input[{n}]"))
            continue
        role, text, images = _item(item, f"input[{n}]")
        if role == "system":
            if said:
                raise invalid("system and developer messages must come first", f"input[{n}]")
            system.append(text)
        elif role == "user":
            said.append(UserSaid(text, images))
        else:
            said.append(ReplySaid(text))
    return "\n\n".join(t for t in system if t) or None, tuple(said)


def _count(items: list[Any], most: int) -> None:
    """Refused before any item is read: more than ``most`` items, or content parts."""
    if len(items) > most:
        raise invalid(f"at most {most} input items in a request; it has {len(items)}", "input")
    parts = sum(len(c) for i in items if isinstance(c := _content(i), list))
    if parts > most:
        message = f"at most {most} content parts in all the input items together; they have {parts}"
        raise invalid(message, "input")


def _content(item: Any) -> Any:
    return item.get("content") if isinstance(item, Mapping) else None


def _item(item: Any, where: str) -> tuple[str, str, tuple[bytes, ...]]:
    """A message item's role (system, user, assistant), its text and its images' bytes."""
    if not isinstance(item, Mapping):
        raise invalid("each input item must be an object", where)
    kind = item.get("type", "message")
    if kind != "message":
        raise unsupported(f"an input item of type {shown(kind)} is not supported", f"{where}.type")
    named = item.get("role")
    role = "system" if named in _SYSTEM_ROLES else named
    if not isinstance(role, str) or role not in _PARTS:
        raise unsupported(f"role {shown(named)} is not supported", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return role, content, ()
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of parts", f"{where}.content")
    texts: list[str] = []
    images: list[bytes] = []
    for k, part in enumerate(content):
        at = f"{where}.content[{k}]"
        part_kind = part.get("type") if isinstance(part, Mapping) else None
        if part_kind not in _PARTS[role]:
            message = f"a content part of type {shown(part_kind)} is not supported in a {named}"
            raise unsupported(f"{message} message", at)
        if part_kind == "input_image":
            images.append(data_uri(part.get("image_url"), at))
        elif isinstance(text := part.get("text"), str):
            texts.append(text)
        else:
            raise invalid("a text part's text must be a string", f"{at}.text")
    return role, "\n".join(texts), tuple(images)


def _call(item: Mapping[str, Any], where: str) -> Said:
    """A ``function_call`` item: a call an earlier reply made (its id the one the API gave)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
        raise invalid("a function_call needs its call_id and name", where)
    if not isinstance(arguments, str):
        raise invalid("a function_call's arguments must be a string (JSON)", f"{where}.arguments")
    return ReplySaid("", None, (FunctionCall(call_id, name, arguments),))


def _output(item: Mapping[str, Any], where: str) -> Said:
    """A ``function_call_output`` item: what the call ``call_id`` answered, as text."""
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise invalid("a function_call_output needs the call_id it answers", f"{where}.call_id")
    if isinstance(output, list):  # content parts: their texts
        texts = [p.get("text") for p in output if isinstance(p, Mapping)]
        if len(texts) != len(output) or not all(isinstance(t, str) for t in texts):
            raise unsupported("a function_call_output's parts must be input_text", where)
        output = "\n".join(t for t in texts if isinstance(t, str))
    if not isinstance(output, str):
        raise invalid("a function_call_output's output must be a string", f"{where}.output")
    return ResultsSaid((ToolResult(call_id, output),))


_TOOL_ITEMS = {"function_call": _call, "function_call_output": _output}

"""OpenAI request bodies read into ours: a conversation of texts and images, and the sampling
params of a ``prompt`` frame. Pure: no I/O, a refusal is an ``ApiError`` naming the field.

Mapped: ``temperature``, ``top_p``, ``max_completion_tokens`` (or ``max_tokens``), ``stop``,
``seed``, ``response_format`` (both endpoints: the prompt frame's ``params.response_format``),
``logprobs`` with ``top_logprobs`` (chat) or ``logprobs`` as a count (completions), the
extensions ``top_k``, ``min_p`` and ``repetition_penalty`` (vLLM's spelling), and ``tools``,
``tool_choice``, ``parallel_tool_calls`` with assistant ``tool_calls`` and ``tool`` messages
(tool_fields.py), and ``n`` (choices.py). Refused unless neutral: ``functions``, ``logit_bias``,
``frequency_penalty``/``presence_penalty`` other than 0, and for completions ``echo``,
``suffix``, ``best_of`` > 1 and more than one prompt. Any other field (``user``, ``metadata``,
``store``, ...) is ignored.

Every list is counted before any of it is read (messages and their content parts, a prompt's
token ids), and each pass over a request is linear in its size: one body costs the event loop
no more than reading it did.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from wschat.protocol import (
    MAX_LOGPROBS,
    ContextOverflow,
    GenerationParams,
    InvalidParams,
    ToolResult,
    parse_params,
)

from ...engine import FunctionCall
from ...settings import Settings
from .errors import ApiError, invalid, unsupported
from .tool_fields import assistant_calls, tool_params, tool_result

# OpenAI's field -> ours; the checks are the prompt frame's (protocol/params.py)
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_new_tokens",
    "max_completion_tokens": "max_new_tokens",
    "seed": "seed",
    "stop": "stop",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "response_format": "response_format",
}
# The most choices (``n``) one request may ask for: each takes a slot of its own
MAX_CHOICES = 8
# The longest value of the client's an error message repeats
SHOWN_CHARS = 40
_JSON_TYPES = {list: "an array", dict: "an object", bool: "a boolean", type(None): "null"}
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


@dataclass(slots=True)
class Part:
    """One message's text and images (the raw bytes of each data URI), in a role; an
    assistant's tool calls, a tool message's result."""

    role: str
    text: str = ""
    images: list[bytes] = field(default_factory=list)
    calls: list[FunctionCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)


@dataclass(slots=True)
class Sampling:
    params: GenerationParams
    stream: bool
    include_usage: bool
    n: int = 1  # choices: replies to the one prompt


@dataclass(slots=True)
class ChatBody:
    """A chat completion: the system text, the turns before the last (user, assistant and tool
    turns, in the order the session checks: sessions/turns.py) and the last: a user's, or the
    results of the calls the assistant turn before it made."""

    sampling: Sampling
    system: str | None
    turns: list[Part]
    last: Part


@dataclass(slots=True)
class CompletionBody:
    """A completion: a prompt as text or as token ids."""

    sampling: Sampling
    text: str | None
    ids: list[int] | None


def chat_body(body: Any, settings: Settings) -> ChatBody:
    """``settings``: the most messages, and the most content parts of all of them together, a
    request may have (``--max-messages``), and the longest reply (``--max-new-tokens``)."""
    body = body_object(body)
    _refuse_unsupported(body)
    tools = tool_params(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list", "messages")
    _count(messages, settings.max_messages)
    system, turns = _turns([_message(m, n) for n, m in enumerate(messages)])
    if not turns or turns[-1].role not in ("user", "tool"):
        raise invalid("the last message must be a user message or tool results", "messages")
    sampling = _sampling(body, settings, _chat_logprobs(body))
    if tools:  # checked as they were read (tool_fields.py)
        sampling.params = parse_params({**sampling.params.to_wire(), **tools})
    return ChatBody(sampling, system, turns[:-1], turns[-1])


def completion_body(body: Any, settings: Settings, context_tokens: int) -> CompletionBody:
    """``context_tokens``: the model's context, which a prompt of token ids must fit."""
    body = body_object(body)
    _refuse_unsupported(body)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        params_of({"logprobs": logprobs}, {"logprobs": "logprobs"}, settings)
    if body.get("echo"):
        raise unsupported("echo is not supported", "echo")
    if body.get("suffix"):
        raise unsupported("suffix is not supported", "suffix")
    if body.get("best_of") not in (None, 1):
        raise unsupported("best_of other than 1 is not supported", "best_of")
    prompt = body.get("prompt")
    # one prompt in a list of one is still one prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt must not be empty", "prompt")
        return CompletionBody(_sampling(body, settings, logprobs), prompt, None)
    if isinstance(prompt, list) and len(prompt) >= context_tokens and type(prompt[0]) is int:
        too_long = f"the prompt is {len(prompt)} tokens; the context holds {context_tokens}"
        raise ApiError.of(ContextOverflow(too_long))
    if isinstance(prompt, list) and prompt and all(type(i) is int and i >= 0 for i in prompt):
        return CompletionBody(_sampling(body, settings, logprobs), None, list(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise unsupported("one prompt per request: several are not supported", "prompt")
    raise invalid("prompt must be a string or a list of token ids", "prompt")


def body_object(body: Any) -> dict[str, Any]:
    """The body as a JSON object naming a model (any: the model served answers it)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise invalid("model must be a string", "model")
    return body


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in ("frequency_penalty", "presence_penalty"):
        value = body.get(name)
        if value is not None and value != 0:
            raise unsupported(f"{name} is not supported (only 0)", name)
    if body.get("logit_bias"):
        raise unsupported("logit_bias is not supported", "logit_bias")


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """``logprobs`` (a boolean) and ``top_logprobs`` (how many alternatives, with it only) as
    the params' count; None: not asked."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is not None and type(asked) is not bool:
        raise invalid("logprobs must be a boolean", "logprobs")
    if top is not None and not asked:
        raise invalid("top_logprobs needs logprobs set to true", "top_logprobs")
    if not asked:
        return None
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_LOGPROBS):
        raise invalid(f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}]", "top_logprobs")
    return top or 0


def _sampling(body: dict[str, Any], settings: Settings, logprobs: int | None = None) -> Sampling:
    params = params_of(body, _SAMPLING, settings)
    if logprobs is not None:
        params = replace(params, logprobs=logprobs)
    stream = body.get("stream")
    if stream is not None and type(stream) is not bool:
        raise invalid("stream must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise invalid("stream_options must be an object", "stream_options")
    if options is not None and not stream:  # as OpenAI's API and vLLM refuse it
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    n = body.get("n")
    if n is not None and (type(n) is not int or not 1 <= n <= MAX_CHOICES):
        raise invalid(f"n must be an integer from 1 to {MAX_CHOICES}", "n")
    return Sampling(params, bool(stream), include_usage, n or 1)


def params_of(
    body: Mapping[str, Any], fields: Mapping[str, str], settings: Settings
) -> GenerationParams:
    """A prompt frame's params from the body's ``fields`` (OpenAI's name -> ours), each checked
    as the prompt frame's is (protocol/params.py) and refused under its OpenAI name."""
    ours: dict[str, Any] = {}
    for name, our_name in fields.items():
        value = body.get(name)
        if value is None:
            continue
        if name == "stop" and isinstance(value, str):
            value = [value]
        if name == "max_tokens" and body.get("max_completion_tokens") is not None:
            continue  # the newer name wins
        try:
            parse_params({our_name: value})
        except InvalidParams as e:
            raise ApiError.of(e, name) from None
        ours[our_name] = value
    # past the server's longest reply: served up to it (finish_reason "length"), as llama.cpp
    # does, since clients and frameworks send large defaults; a WebSocket prompt is refused
    if ours.get("max_new_tokens", 0) > settings.max_new_tokens:
        ours["max_new_tokens"] = settings.max_new_tokens
    return parse_params(ours)


def _count(messages: list[Any], most: int) -> None:
    """Refused before any message is read: more than ``most`` messages, or content parts."""
    if len(messages) > most:
        raise invalid(f"at most {most} messages in a request; it has {len(messages)}", "messages")
    parts = sum(len(c) for m in messages if isinstance(c := _content(m), list))
    if parts > most:
        raise invalid(
            f"at most {most} content parts in all the messages together; they have {parts}",
            "messages",
        )


def _content(message: Any) -> Any:
    return message.get("content") if isinstance(message, Mapping) else None


def _message(message: Any, n: int) -> Part:
    param = f"messages[{n}]"
    if not isinstance(message, Mapping):
        raise invalid("each message must be an object", param)
    named = message.get("role")
    role = _ROLES.get(named) if isinstance(named, str) else None
    if role is None:
        raise unsupported(f"role {shown(named)} is not supported", f"{param}.role")
    calls = assistant_calls(message, param) if role == "assistant" else []
    content = message.get("content")
    if content is None and calls:
        content = ""  # an assistant message that only calls tools
    part = Part(role, calls=calls)
    if isinstance(content, str):
        part.text = content
    elif not isinstance(content, list):
        raise invalid("content must be a string or a list of parts", f"{param}.content")
    else:
        _parts(part, content, param)
    if role == "tool":
        part.results.append(tool_result(message, part.text, param))
    return part


def _parts(part: Part, content: list[Any], param: str) -> None:
    """A message's content parts: texts (joined by a line break) and a user's images."""
    role = part.role
    texts: list[str] = []
    for k, item in enumerate(content):
        where = f"{param}.content[{k}]"
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "text" and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif kind == "image_url" and role == "user":
            part.images.append(data_uri(item.get("image_url"), where))
        else:
            raise unsupported(f"a content part of type {shown(kind)} is not supported here", where)
    part.text = "\n".join(texts)


def shown(value: Any) -> str:
    """A value the client sent, as an error message names it: a string or a number, cut short
    (a message never repeats a large part of the body)."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return f"({_JSON_TYPES.get(type(value), 'a value')})"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def data_uri(value: Any, where: str) -> bytes:
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str) or not url.startswith("data:"):
        raise unsupported("an image must be a data URI (data:image/...;base64,...)", where)
    header, _, data = url.partition(",")
    if not header.endswith(";base64"):
        raise invalid("an image data URI must be base64", where)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("the image is not valid base64", param=where, code="bad_image") from None


def _turns(parts: list[Part]) -> tuple[str | None, list[Part]]:
    """The system text (leading system messages) and the turns after it, each run of messages
    of one role joined (texts by a blank line): user, assistant, user, ..."""
    lead = next((n for n, part in enumerate(parts) if part.role != "system"), len(parts))
    turns: list[Part] = []
    texts: list[list[str]] = []  # each turn's texts, joined once at the end
    for part in parts[lead:]:
        if part.role == "system":
            raise invalid("system messages must come before the conversation", "messages")
        if not turns or turns[-1].role != part.role:
            turns.append(Part(part.role))
            texts.append([])
        turns[-1].images += part.images
        turns[-1].calls += part.calls
        turns[-1].results += part.results
        if part.text and part.role != "tool":
            texts[-1].append(part.text)
    if turns and turns[0].role != "user":
        raise invalid("the conversation must start with a user message", "messages")
    for turn, run in zip(turns, texts, strict=True):
        turn.text = "\n\n".join(run)
    system = "\n\n".join(part.text for part in parts[:lead] if part.text) or None
    return system, turns

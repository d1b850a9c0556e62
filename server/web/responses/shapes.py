"""A response in OpenAI's shapes: the response object (what ``POST``, ``GET`` and a stream's
``response.*`` events carry) and the events of its stream, each with its ``sequence_number``
(and its WebSocket lane's ``stream_id``, where the create named one), as the SDK's types in
``openai/types/responses/`` spell them.

A response streams ``response.created`` and ``response.in_progress``; its output items in the
order they came: its text a ``message`` (``response.output_item.added``,
``response.content_part.added``, a ``response.output_text.delta`` per token frame, then at its
end ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``), each tool call a ``function_call`` (``output_item.added``,
its arguments whole in one ``response.function_call_arguments.delta``,
``response.function_call_arguments.done``, ``output_item.done``); then its end:
``response.completed``; ``response.incomplete`` (status ``incomplete`` with the reason
``max_output_tokens``, or status ``cancelled``: the SDK knows no event of its own for it);
``response.failed`` (with its ``error``). A response with neither text nor calls still has its
message, empty.

Each event is made as the JSON text it is sent as (``Event``), once: a text delta from its
message's template (the only event per token), the response object encoded once for
``response.created`` and ``response.in_progress`` alike.
"""

from __future__ import annotations

import json
import secrets
import time
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

from wschat.protocol import Done, FinishReason

from ..openai_api.errors import ApiError
from .request import CreateBody

# a reply's finish -> the response's status and its terminal event
_ENDS = {
    FinishReason.STOP: ("completed", "response.completed"),
    FinishReason.TOOL_CALLS: ("completed", "response.completed"),
    FinishReason.LENGTH: ("incomplete", "response.incomplete"),
    FinishReason.CANCELLED: ("cancelled", "response.incomplete"),
    FinishReason.ERROR: ("failed", "response.failed"),
}
# a failure's wire code -> the response error's code (openai/types/responses/response_error.py)
_ERROR_CODES = {"overloaded": "rate_limit_exceeded"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class Event(NamedTuple):
    """An event of a response's stream: its type, and its JSON text as sent."""

    kind: str
    data: str


def encoded(value: Any) -> str:
    """JSON as every event is sent: compact, ASCII (as ``json.dumps`` writes it by default)."""
    return json.dumps(value, separators=(",", ":"))


class ResponseShape:
    """One response's object as it stands, and its stream's events in turn."""

    def __init__(
        self,
        response_id: str,
        model: str,
        body: CreateBody,
        stream_id: str | None = None,
    ) -> None:
        self.id = response_id
        self.item_id = new_id("msg")
        self.model = model
        self.body = body
        self.stream_id = stream_id
        self.created_at = int(time.time())
        self.completed_at: int | None = None
        self.status = "in_progress"
        self.text: list[str] = []  # the output's pieces, joined once it ended
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, str] | None = None
        self.incomplete: dict[str, str] | None = None
        # the output items as they came: the message's place (None until its text came), each
        # function call's item
        self.items: list[dict[str, Any] | None] = []
        self.message_at: int | None = None
        self.sequence = 0
        # a text delta's JSON around its text and its sequence number, once its message opened
        self._delta_head = ""
        self._delta_tail = ',"logprobs":[],"sequence_number":'
        self._lane = "}" if stream_id is None else f',"stream_id":{encoded(stream_id)}}}'

    def object(self) -> dict[str, Any]:
        body = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": False,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.echoed["max_output_tokens"],
            "max_tool_calls": None,
            "metadata": body.echoed["metadata"] or {},
            "model": self.model,
            "output": [item or self._message() for item in self.items],
            "parallel_tool_calls": body.params.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store,
            "temperature": body.echoed["temperature"],
            "text": body.echoed["text"],
            "tool_choice": body.echoed["tool_choice"] or "auto",
            "tools": body.echoed["tools"] or [],
            "top_p": body.echoed["top_p"],
            "truncation": "disabled",
            "usage": self.usage,
        }

    def _message(self) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "type": "message",
            "status": self._item_status(),
            "role": "assistant",
            "content": [self._part()],
        }

    def _item_status(self) -> str:
        if self.status == "in_progress":
            return "in_progress"
        return "completed" if self.status == "completed" else "incomplete"

    def _part(self, text: str | None = None) -> dict[str, Any]:
        text = "".join(self.text) if text is None else text
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        return Event(kind, encoded(event))

    def _with_response(self, kind: str, response: str) -> Event:
        """``event(kind, response=...)`` around the response object already encoded."""
        data = f'{{"type":"{kind}","response":{response},"sequence_number":{self.sequence}'
        self.sequence += 1
        return Event(kind, data + self._lane)

    def opening(self) -> list[Event]:
        """``response.created`` and ``response.in_progress``."""
        response = encoded(self.object())
        return [
            self._with_response("response.created", response),
            self._with_response("response.in_progress", response),
        ]

    def _open_message(self) -> list[Event]:
        """The message's item and its text part added, where they are not yet."""
        if self.message_at is not None:
            return []
        self.message_at = len(self.items)
        self.items.append(None)
        item = {**self._message(), "content": []}
        where = {"item_id": self.item_id, "output_index": self.message_at, "content_index": 0}
        self._delta_head = (
            f'{{"type":"response.output_text.delta","item_id":"{self.item_id}",'
            f'"output_index":{self.message_at},"content_index":0,"delta":'
        )
        return [
            self.event("response.output_item.added", output_index=self.message_at, item=item),
            self.event("response.content_part.added", **where, part=self._part("")),
        ]

    def delta(self, text: str) -> list[Event]:
        """A token frame's text: its ``response.output_text.delta`` (after its message's
        opening, the first time), made from the message's template: what ``event`` would
        encode, byte for byte."""
        events = self._open_message() if self.message_at is None else []
        self.text.append(text)
        data = (
            f"{self._delta_head}{encode_basestring_ascii(text)}"
            f"{self._delta_tail}{self.sequence}{self._lane}"
        )
        self.sequence += 1
        events.append(Event("response.output_text.delta", data))
        return events

    def call(self, call_id: str, name: str, arguments: str) -> list[Event]:
        """A tool call of the reply, whole: its item added, its arguments, its item done."""
        at = len(self.items)
        item = {"id": new_id("fc"), "type": "function_call", "call_id": call_id, "name": name}
        self.items.append({**item, "arguments": arguments, "status": "completed"})
        where = {"item_id": item["id"], "output_index": at}
        added = {**item, "arguments": "", "status": "in_progress"}
        return [
            self.event("response.output_item.added", output_index=at, item=added),
            self.event("response.function_call_arguments.delta", **where, delta=arguments),
            self.event("response.function_call_arguments.done", **where, arguments=arguments),
            self.event("response.output_item.done", output_index=at, item=self.items[at]),
        ]

    def ended(self, done: Done, error: ApiError | None) -> None:
        """Its status, usage and error from its reply's ``done`` (and the error sent before)."""
        self.status = _ENDS[done.reason][0]
        self.text = [done.text]
        self.completed_at = int(time.time()) if self.status == "completed" else None
        if done.reason is FinishReason.LENGTH:
            self.incomplete = {"reason": "max_output_tokens"}
        if done.reason is FinishReason.ERROR:
            wire = error.code if error is not None else None
            message = error.message if error is not None else "generation failed"
            self.error = {"code": _ERROR_CODES.get(wire or "", "server_error"), "message": message}
        u = done.usage
        self.usage = {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }

    def closing(self) -> list[Event]:
        """The message's end (opened empty where neither text nor a call came), then the
        terminal event, once ``ended``."""
        events = [] if self.items else self._open_message()
        if self.message_at is not None:
            text = "".join(self.text)
            at = self.message_at
            where = {"item_id": self.item_id, "output_index": at, "content_index": 0}
            events += [
                self.event("response.output_text.done", **where, text=text, logprobs=[]),
                self.event("response.content_part.done", **where, part=self._part()),
                self.event("response.output_item.done", output_index=at, item=self._message()),
            ]
        terminal = next(event for status, event in _ENDS.values() if status == self.status)
        return [*events, self.event(terminal, response=self.object())]

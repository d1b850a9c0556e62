"""A response in OpenAI's shapes: the response object (what ``POST``, ``GET`` and a stream's
``response.*`` events carry) and the events of its stream, each with its ``sequence_number``
(and its WebSocket lane's ``stream_id``, where the create named one), as the SDK's types in
``openai/types/responses/`` spell them.

A text response streams, in order: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, a
``response.output_text.delta`` per token frame, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then its end:
``response.completed``; ``response.incomplete`` (status ``incomplete`` with the reason
``max_output_tokens``, or status ``cancelled``: the SDK knows no event of its own for it);
``response.failed`` (with its ``error``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from wschat.protocol import Done, FinishReason

from ..openai_api.errors import ApiError
from .request import CreateBody

# a reply's finish -> the response's status and its terminal event
_ENDS = {
    FinishReason.STOP: ("completed", "response.completed"),
    FinishReason.LENGTH: ("incomplete", "response.incomplete"),
    FinishReason.CANCELLED: ("cancelled", "response.incomplete"),
    FinishReason.ERROR: ("failed", "response.failed"),
}
# a failure's wire code -> the response error's code (openai/types/responses/response_error.py)
_ERROR_CODES = {"overloaded": "rate_limit_exceeded"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


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
        self.item_added = False
        self.sequence = 0

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
            "output": [self._item()] if self.item_added else [],
            "parallel_tool_calls": True,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store,
            "temperature": body.echoed["temperature"],
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": body.echoed["top_p"],
            "truncation": "disabled",
            "usage": self.usage,
        }

    def _item(self) -> dict[str, Any]:
        done = self.status != "in_progress"
        status = "completed" if self.status == "completed" else "incomplete"
        return {
            "id": self.item_id,
            "type": "message",
            "status": status if done else "in_progress",
            "role": "assistant",
            "content": [self._part()] if self.item_added else [],
        }

    def _part(self, text: str | None = None) -> dict[str, Any]:
        text = "".join(self.text) if text is None else text
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        return event

    def opening(self) -> list[dict[str, Any]]:
        """From ``response.created`` to the output text's part added."""
        events = [
            self.event("response.created", response=self.object()),
            self.event("response.in_progress", response=self.object()),
        ]
        self.item_added = True
        item = {**self._item(), "content": []}
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        events.append(self.event("response.output_item.added", output_index=0, item=item))
        events.append(self.event("response.content_part.added", **where, part=self._part("")))
        return events

    def delta(self, text: str) -> dict[str, Any]:
        self.text.append(text)
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return self.event("response.output_text.delta", **where, delta=text, logprobs=[])

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

    def closing(self) -> list[dict[str, Any]]:
        """From the output text's end to the terminal event, once ``ended``."""
        text = "".join(self.text)
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        terminal = next(event for status, event in _ENDS.values() if status == self.status)
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=self._part()),
            self.event("response.output_item.done", output_index=0, item=self._item()),
            self.event(terminal, response=self.object()),
        ]

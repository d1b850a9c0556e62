"""A tool loop, typed (PROTOCOL.md "Tool calls"): ``Chat.run`` prompts with tools, yields the
reply's text pieces and each call the model makes, and once every call of a reply has its answer
sends them (``tool_results``) and goes on with the next reply, until one answers in text::

    async for event in chat.run("Weather in Paris?", tools=[WEATHER], tool_choice="required"):
        if isinstance(event, CallRequest):
            event.answer(get_weather(**event.arguments))  # a str, or anything json.dumps takes
        else:
            print(event, end="")  # a piece of the text of a reply

A call is answered before the loop is asked for the next event; one left unanswered when its
reply ends raises ``ValueError`` (the server needs one result per call). ``ToolLoop.replies``
holds every reply of the loop, the last one's ``text`` the answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from wschat.protocol import FinishReason, ToolCall

from .reply import Reply


@dataclass(eq=False)
class CallRequest:
    """A call the model made: the tool's ``name`` and its ``arguments`` (parsed), to
    ``answer``."""

    call: ToolCall
    arguments: dict[str, Any] = field(init=False)
    result: str | None = None

    def __post_init__(self) -> None:
        self.arguments = json.loads(self.call.arguments)

    @property
    def name(self) -> str:
        return self.call.name

    @property
    def id(self) -> str:
        return self.call.call_id

    def answer(self, result: Any) -> None:
        """What the tool answered: a str as it is, anything else as its JSON."""
        self.result = result if isinstance(result, str) else json.dumps(result)


class ToolLoop:
    """The replies of one tool loop, as ``Chat.run`` makes them."""

    def __init__(self, first: Reply, answer: Callable[[dict[str, str]], Reply]) -> None:
        self.replies = [first]
        self._answer = answer  # sends the results of the last reply's calls: the next reply

    @property
    def text(self) -> str:
        """The last reply's text: the answer, once the loop ended."""
        return self.replies[-1].text

    def __aiter__(self) -> AsyncIterator[str | CallRequest]:
        return self._events()

    async def _events(self) -> AsyncIterator[str | CallRequest]:
        while True:
            reply = self.replies[-1]
            requests: list[CallRequest] = []
            async for event in reply.events():
                if isinstance(event, str):
                    yield event
                else:
                    requests.append(CallRequest(event))
                    yield requests[-1]
            done = reply.done
            if done is None or done.reason is not FinishReason.TOOL_CALLS:
                return
            unanswered = [r.id for r in requests if r.result is None]
            if unanswered:
                raise ValueError(f"tool call {unanswered[0]!r} was not answered")
            self.replies.append(self._answer({r.id: str(r.result) for r in requests}))

"""An API request's conversation as the session takes it (``Converse``): its system text, its
messages and the turn to answer, held by the session to a prompt frame's rules, so that it
takes the same checks, slots, engine path and events as a WebSocket prompt.

A reply the API gave comes back as text in the next request of its conversation; ``ReplyIds``
remembers the ids it was generated as, so the conversation renders exactly as a session holding
it would (same prompt ids, and a prefix the engine's KV state still matches). A text it never
gave is tokenized as a user's text is.
"""

from __future__ import annotations

import secrets
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from ...engine import FunctionCall, calls_text
from ...sessions import Converse, ReplySaid, ResultsSaid, Said, UserSaid
from .requests import ChatBody, Part

# Ids of replies remembered, all together (4 bytes each)
MAX_REPLY_IDS = 1 << 20


class ReplyIds:
    """The ids of recent replies by their text, least recently used forgotten first."""

    def __init__(self, max_ids: int = MAX_REPLY_IDS) -> None:
        self.max_ids = max_ids
        self._held = 0
        self._replies: OrderedDict[str, array[int]] = OrderedDict()

    def remember(self, text: str, ids: Sequence[int]) -> None:
        if not text or len(ids) > self.max_ids:
            return
        old = self._replies.pop(text, None)
        self._held -= len(old) if old is not None else 0
        self._replies[text] = array("i", ids)
        self._held += len(ids)
        while self._held > self.max_ids:
            _, dropped = self._replies.popitem(last=False)
            self._held -= len(dropped)

    def get(self, text: str) -> list[int] | None:
        ids = self._replies.get(text)
        if ids is None:
            return None
        self._replies.move_to_end(text)
        return list(ids)

    def known(self, said: Said) -> Said:
        """``said``; a reply the API gave, sent back as its text alone, with the ids it was
        generated as where they are remembered."""
        if isinstance(said, ReplySaid) and said.ids is None:
            ids = self.get(reply_key(said.text, said.calls))
            if ids is not None:
                return ReplySaid(said.text, tuple(ids), said.calls)
        return said


def new_prompt_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def conversation_of(body: ChatBody, replies: ReplyIds) -> Converse:
    """The request's conversation, each reply this API gave as the ids it was generated as (read
    here, on the loop: ``ReplyIds`` is the loop's)."""
    history = tuple(said_of(turn, replies) for turn in body.turns)
    last = said_of(body.last, replies)
    assert isinstance(last, UserSaid | ResultsSaid)  # requests.py: the last is one of them
    return Converse(new_prompt_id("chatcmpl"), body.system, history, last, body.sampling.params)


def said_of(turn: Part, replies: ReplyIds) -> Said:
    """A turn of the request as the session takes it; a reply by the text it is remembered
    under (a reply that called tools: its calls' text, tools.py ``calls_text``)."""
    if turn.role == "user":
        return UserSaid(turn.text, tuple(turn.images))
    if turn.role == "tool":
        return ResultsSaid(tuple(turn.results))
    known = replies.get(reply_key(turn.text, turn.calls))
    return ReplySaid(turn.text, tuple(known) if known is not None else None, tuple(turn.calls))


def reply_key(text: str, calls: Sequence[FunctionCall]) -> str:
    """What a reply's ids are remembered under: its text, or its calls' text."""
    return calls_text(text, calls) if calls else text

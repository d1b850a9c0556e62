"""What a conversation is made of, as token ids: exchanges (a user turn, the replies that called
tools with their results, the last reply), the turn a prompt ends with, and the one walk every
prompt format (formats.py) lays them out by: user and model turns in turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .tools import FunctionCall


@dataclass(frozen=True, slots=True)
class ToolRound:
    """Within an exchange, a reply that called tools and their results: the reply's ids as
    generated (or its text's, tools.py ``calls_text``), the results' as the next user turn's
    text (tools.py ``results_text``)."""

    reply_ids: list[int]
    result_ids: list[int]


@dataclass(slots=True)
class Exchange:
    """One finished (or cancelled) user turn and the reply to it, as they were prompted: the
    replies that called tools and their results first (``rounds``), then the last reply."""

    user_ids: list[int]
    image_ids: list[list[int]]  # one placeholder run per image, before the text
    images: list[Any]
    reply_ids: list[int]  # as generated, with the token that ended the reply if one did
    rounds: list[ToolRound] = field(default_factory=list)
    # the calls the last reply makes, which await their results (none: it answered)
    calls: tuple[FunctionCall, ...] = ()


@dataclass(frozen=True, slots=True)
class UserTurn:
    """The turn a prompt ends with: a user's, or (``rounds``) one whose replies called tools,
    the results of the last ones its new text."""

    ids: list[int]
    image_ids: Sequence[Sequence[int]] = ()
    rounds: Sequence[ToolRound] = ()


def without_end(reply: Sequence[int], end_ids: frozenset[int]) -> list[int]:
    """A reply's ids less the end-of-turn ids it closed with: what a format lays out itself, and
    what a message of the conversation (``Conversation.messages``) carries."""
    ids = list(reply)
    while ids and ids[-1] in end_ids:
        ids.pop()
    return ids


def user_content(user: UserTurn | Exchange) -> list[int]:
    images = user.image_ids
    text = user.ids if isinstance(user, UserTurn) else user.user_ids
    return [i for run in images for i in run] + list(text)


def turns_of(
    history: Sequence[Exchange], user: UserTurn
) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """The conversation as each format lays it out: (user content, reply as generated) pairs,
    a round's results the user content of the pair after it, and the content of the turn the
    prompt ends with."""
    pairs: list[tuple[list[int], list[int]]] = []
    for exchange in history:
        content = user_content(exchange)
        for round_ in exchange.rounds:
            pairs.append((content, round_.reply_ids))
            content = round_.result_ids
        pairs.append((content, exchange.reply_ids))
    content = user_content(user)
    for round_ in user.rounds:
        pairs.append((content, round_.reply_ids))
        content = round_.result_ids
    return pairs, content

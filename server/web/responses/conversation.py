"""A create as the session takes it (``Converse``, as a chat completion is): the conversation of
the response it continues (``previous_response_id``), then its input, each run of one kind of
message joined into one (a user's texts by a blank line), its last message the turn to answer.

Its system text is the create's ``instructions`` before the system text of the conversation's
first input: as in OpenAI's API, a continuation does not take the instructions of the response
before it, so a client that wants them sends them again. A reply the client sends back as text
is taken as the ids it was generated as where the API remembers them (``ReplyIds``, shared with
the chat API), so the conversation renders as the engine last saw it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...sessions import Converse, ReplySaid, ResultsSaid, Said, UserSaid
from ..openai_api.conversation import ReplyIds
from ..openai_api.errors import invalid, unsupported
from .kept import Kept
from .request import CreateBody


def converse_of(
    response_id: str, body: CreateBody, previous: Kept | None, replies: ReplyIds
) -> tuple[Converse, str | None]:
    """The create's ``Converse`` (its id ``response_id``), and its conversation's system text
    (what a continuation of it takes)."""
    if previous is not None and body.system is not None:
        message = "system and developer messages start a conversation; a continuation takes none"
        raise unsupported(f"{message} (send instructions)", "input")
    system = previous.system if previous is not None else body.system
    said = [*(previous.said if previous is not None else ()), *body.said]
    turns = [replies.known(turn) for turn in joined(said)]
    if not turns:
        raise invalid("the input must hold a user message", "input")
    if isinstance(turns[0], ReplySaid):
        raise invalid("the conversation must start with a user message", "input")
    last = turns[-1]
    if not isinstance(last, UserSaid | ResultsSaid):
        message = "the input must end with a user message or function_call_output items"
        raise invalid(message, "input")
    instructed = "\n\n".join(t for t in (body.instructions, system) if t) or None
    return Converse(response_id, instructed, tuple(turns[:-1]), last, body.params), system


def joined(said: Sequence[Said]) -> list[Said]:
    """Each run of one kind of message as one: a user's texts by a blank line and its images in
    order; a reply's texts likewise and its calls in order (a reply's message and its
    ``function_call`` items are one reply; its ids known only where the run is one); results in
    order."""
    turns: list[Said] = []
    for message in said:
        before = turns[-1] if turns else None
        if isinstance(message, UserSaid) and isinstance(before, UserSaid):
            text = _text(before.text, message.text)
            turns[-1] = UserSaid(text, (*before.images, *message.images))
        elif isinstance(message, ReplySaid) and isinstance(before, ReplySaid):
            calls = (*before.calls, *message.calls)
            turns[-1] = ReplySaid(_text(before.text, message.text), None, calls)
        elif isinstance(message, ResultsSaid) and isinstance(before, ResultsSaid):
            turns[-1] = ResultsSaid((*before.results, *message.results))
        else:
            turns.append(message)
    return turns


def _text(before: str, after: str) -> str:
    return "\n\n".join(t for t in (before, after) if t)

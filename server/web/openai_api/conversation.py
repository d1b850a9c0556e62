"""An API request as a session: the conversation it sends, rebuilt as a ``Chat`` turn by turn,
then its last user message run as a ``prompt`` frame, so that it takes the same checks, slots,
engine path and events as a WebSocket prompt.

A reply the API gave comes back as text in the next request of its conversation; ``ReplyIds``
remembers the ids it was generated as, so the conversation renders exactly as a session holding
it would (same prompt ids, and a prefix the engine's KV state still matches). A text it never
gave is tokenized as a user's text is.
"""

from __future__ import annotations

import functools
import secrets
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from wschat.protocol import Prompt

from ...engine import (
    Chat,
    Conversation,
    ConversationTooLong,
    Engine,
    Message,
    PreparedTurn,
    PromptTooLong,
    Turn,
)
from ...sessions.gates import Gate
from ...sessions.session import Session
from ...sessions.slots import GenerationSlots
from ...sessions.stats import OPENAI_API, ServerStats
from ...settings import Settings
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


def api_session(
    engine: Engine,
    settings: Settings,
    stats: ServerStats,
    slots: GenerationSlots,
    image_checks: Gate,
) -> Session:
    """A session of its own for one request: never in the session store, never resumed; its
    images checked in the server's turns (``image_checks``)."""
    key = f"api-{secrets.token_hex(8)}"
    session = Session(key, engine, slots, settings, image_checks=image_checks)
    session.listeners.append(functools.partial(stats.on_run_event, api=OPENAI_API))
    return session


def new_prompt_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


async def load_chat(
    session: Session, body: ChatBody, replies: ReplyIds, settings: Settings
) -> Prompt:
    """Rebuild the request's conversation in ``session``'s chat; the prompt frame of its last
    user message (refusals as the session's: too large, unsupported, bad image, over the
    context). Its texts are tokenized together, in the tokenizer's worker thread when they are
    long, and the context checked before the conversation is rendered."""
    engine = session.engine
    conversation = session.chat.conversation
    texts = [body.system or "", *(p.text for exchange in body.exchanges for p in exchange)]
    for text in texts:
        session.limits.check_text(text, what="a message's text")
    # the replies this API gave, as their ids (read on the loop: ``ReplyIds`` is its own)
    known = [replies.get(assistant.text) for _, assistant in body.exchanges]
    chars = sum(map(len, texts))
    system_ids, exchange_ids = await engine.text_tokenizer.run(
        functools.partial(_tokenized, conversation, body, known), chars
    )
    held = len(system_ids) + sum(len(u) + len(r) for u, r in exchange_ids)
    context = engine.info.context_tokens
    if held >= context:
        raise ConversationTooLong(
            f"the conversation's messages are {held} tokens; the context holds {context}"
        )
    if body.system:
        conversation.set_system(body.system, system_ids)
    for (user, _), (user_ids, reply) in zip(body.exchanges, exchange_ids, strict=True):
        images = await _images(session, user)
        placeholder = engine.image_placeholder_ids() if images else []
        conversation.add_exchange(user_ids, [list(placeholder) for _ in images], images, reply)
    return Prompt(
        new_prompt_id("chatcmpl"),
        body.user.text,
        tuple(body.user.images),
        body.sampling.params,
    )


def _tokenized(
    conversation: Conversation, body: ChatBody, known: list[list[int] | None]
) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """The system text's ids and each exchange's (user, reply) ids; a reply in ``known`` as it
    is there. Pure work on the tokenizer, for its worker thread."""
    system = conversation.tokenize_system(body.system) if body.system else []
    exchanges = [
        (
            conversation.tokenize_user(user.text),
            reply if reply is not None else conversation.tokenize_user(assistant.text),
        )
        for (user, assistant), reply in zip(body.exchanges, known, strict=True)
    ]
    return system, exchanges


async def _images(session: Session, part: Part) -> list[object]:
    """An earlier turn's images as the session keeps them, checked as a prompt's are."""
    if not part.images:
        return []
    rules = session.image_rules()
    rules.require()
    rules.count(len(part.images), per="message")
    checked = await rules.check(part.images, session.image_checks)
    rules.budget(session.held_images, checked, whose="the conversation's", advice="")
    return [c.image for c in checked]


class CompletionChat(Chat):
    """A raw completion: the prompt is the request's ids (or its text tokenized as text, no
    markup added), not a conversation rendered in the prompt format."""

    def __init__(self, engine: Engine, key: str, ids: list[int] | None) -> None:
        super().__init__(engine, key)
        self._ids = ids

    async def prepare(self, turn: Turn, *, max_user_tokens: int) -> PreparedTurn:
        ids = self._ids
        if ids is None:
            tokenize = self.conversation.tokenize_system  # text as text, in every format
            ids = await self._engine.text_tokenizer.tokenize(tokenize, turn.text)
        if len(ids) > max_user_tokens:
            raise PromptTooLong(f"prompt is over {max_user_tokens} tokens")
        context = self._engine.info.context_tokens
        if len(ids) >= context:
            raise ConversationTooLong(
                f"the prompt needs {len(ids)} tokens; the context holds {context}"
            )
        return PreparedTurn(turn, len(ids), len(ids), ids, [], ids, [Message("user", ids)])

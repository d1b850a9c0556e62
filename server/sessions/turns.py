"""How a turn is made ready to run, which the core (core.py) asks for and ``Session`` awaits: the
uploads it carries checked (images.py: in the server's turns, then the session's byte budget),
its text tokenized and the whole counted against the context (``Chat``); a conversation sent
whole (an API request's) set in the chat first. Each kind of turn has its case in ``PREPARE``;
each refusal is raised as the rules or the engine raise it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wschat.protocol import Image, InvalidParams

from ..engine import (
    Chat,
    Conversation,
    ConversationTooLong,
    Engine,
    Message,
    PreparedTurn,
    PromptTooLong,
    SamplingParams,
    ToolRound,
    ToolUse,
    Turn,
    calls_text,
    held_to_tools,
    results_text,
)
from ..settings import Settings
from .effects import CompletionTurn, PrepareTurn, PromptTurn, RegenerateTurn, ResultsTurn, TurnKind
from .gates import Gate
from .inputs import Converse, ReplySaid, ResultsSaid, Said, UserSaid
from .limits import check_answers

if TYPE_CHECKING:
    from .images import CheckedImage, ImageRules


@dataclass(frozen=True, slots=True)
class Preparing:
    """What preparing a session's turns needs: its engine and chat, the server's limits and
    turns of image checks, and the images the session holds (read when its budget is)."""

    engine: Engine
    chat: Chat
    settings: Settings
    max_images: int
    image_checks: Gate
    held_images: Callable[[], list[Any]]

    def image_rules(self) -> ImageRules:
        from .images import ImageRules  # Pillow loads only for images

        return ImageRules.of(self.engine, self.settings, self.max_images)


async def check_staged(preparing: Preparing, frame: Image, staged: int) -> CheckedImage:
    """An ``image`` frame's upload, to be staged after ``staged`` others."""
    rules = preparing.image_rules()
    rules.require(frame.id)
    rules.stage(staged, frame.id)
    (image,) = await rules.check([frame.data], preparing.image_checks, frame.id)
    rules.budget(preparing.held_images(), [image], frame.id)
    return image


async def prepare(preparing: Preparing, effect: PrepareTurn) -> PreparedTurn:
    return await PREPARE[type(effect.turn)](preparing, effect.id, effect.turn)


async def _held(
    preparing: Preparing, sampling: SamplingParams, tools: ToolUse | None
) -> SamplingParams:
    """The sampling a reply runs with: held to its tools' grammar (engine tool_grammar.py), its
    format ready in the engine (refused: invalid_params, unsupported)."""
    remote = preparing.engine.info.remote is not None
    held = held_to_tools(sampling, tools, remote=remote)
    await preparing.engine.prepare_reply(held)
    return held


async def _prompt(preparing: Preparing, prompt_id: str, turn: TurnKind) -> PreparedTurn:
    assert isinstance(turn, PromptTurn)
    sampling = await _held(preparing, turn.sampling, turn.tools)
    images = list(turn.staged)
    if turn.uploads:
        rules = preparing.image_rules()
        rules.require(prompt_id)
        rules.count(len(turn.staged) + len(turn.uploads), prompt_id)
        checked = await rules.check(turn.uploads, preparing.image_checks, prompt_id)
        rules.budget(preparing.held_images(), checked, prompt_id)
        images += checked
    user = Turn(turn.text, sampling, [image.image for image in images], turn.tools)
    # a refusal (too large, context overflow) goes to the error boundary as the engine raised it
    limit = preparing.settings.max_prompt_tokens
    return await preparing.chat.prepare(user, max_user_tokens=limit)


async def _regenerate(preparing: Preparing, prompt_id: str, turn: TurnKind) -> PreparedTurn:
    assert isinstance(turn, RegenerateTurn)
    sampling = await _held(preparing, turn.sampling, turn.tools)
    return await preparing.chat.prepare_regenerate(sampling, turn.tools)


async def _results(preparing: Preparing, prompt_id: str, turn: TurnKind) -> PreparedTurn:
    assert isinstance(turn, ResultsTurn)
    sampling = await _held(preparing, turn.sampling, turn.tools)
    return await preparing.chat.prepare_results(turn.results, sampling, turn.tools)


async def _completion(preparing: Preparing, prompt_id: str, turn: TurnKind) -> PreparedTurn:
    """A raw prompt: its ids, or its text tokenized as text (no markup added), not a
    conversation rendered in the prompt format."""
    assert isinstance(turn, CompletionTurn)
    await preparing.engine.prepare_reply(turn.sampling)
    engine = preparing.engine
    if turn.ids is not None:
        ids = list(turn.ids)
    else:
        tokenize = preparing.chat.conversation.tokenize_system  # text as text, in every format
        ids = await engine.text_tokenizer.tokenize(tokenize, turn.text or "")
    limit = preparing.settings.max_prompt_tokens
    if len(ids) > limit:
        raise PromptTooLong(f"prompt is over {limit} tokens")
    context = engine.info.context_tokens
    if len(ids) >= context:
        raise ConversationTooLong(
            f"the prompt needs {len(ids)} tokens; the context holds {context}"
        )
    user = Turn(turn.text or "", turn.sampling, [])
    return PreparedTurn(user, len(ids), len(ids), ids, [], ids, [Message("user", ids)])


PREPARE = {
    PromptTurn: _prompt,
    RegenerateTurn: _regenerate,
    ResultsTurn: _results,
    CompletionTurn: _completion,
}


async def load_conversation(preparing: Preparing, request: Converse) -> None:
    """The conversation before the turn to answer, set in the chat: its order checked (tool
    results answer the calls before them, one each), its texts tokenized together (in the
    tokenizer's worker thread when they are long), a reply the door knows the ids of as those
    ids, and the context checked before anything is rendered; each user message's images
    checked as a prompt's."""
    engine, conversation = preparing.engine, preparing.chat.conversation
    exchanges = exchanges_of(request.history, isinstance(request.user, ResultsSaid))
    chars = len(request.system or "") + sum(len(t) for s in request.history for t in s.texts)
    system_ids, exchange_ids = await engine.text_tokenizer.run(
        functools.partial(_tokenized, conversation, request.system, exchanges), chars
    )
    held = len(system_ids) + sum(
        len(user) + len(reply) + sum(len(r.reply_ids) + len(r.result_ids) for r in rounds)
        for user, rounds, reply in exchange_ids
    )
    context = engine.info.context_tokens
    if held >= context:
        raise ConversationTooLong(
            f"the conversation's messages are {held} tokens; the context holds {context}"
        )
    if request.system:
        conversation.set_system(request.system, system_ids)
    for sent, (user_ids, rounds, reply) in zip(exchanges, exchange_ids, strict=True):
        images = await _message_images(preparing, sent.user)
        runs = [list(engine.image_placeholder_ids()) for _ in images]
        conversation.add_exchange(user_ids, runs, images, reply, rounds, sent.reply.calls)


@dataclass(frozen=True, slots=True)
class SentExchange:
    """An exchange of a conversation sent whole: the user's message, each reply that called
    tools with their results, and the last reply (whose calls, if it made any, await results)."""

    user: UserSaid
    rounds: tuple[tuple[ReplySaid, ResultsSaid], ...]
    reply: ReplySaid


AFTER_CALLS = "tool results must follow a reply that called tools"
ORDER = (
    "the messages before the last must go: a user's, then the replies to it (one with tool calls"
    " followed by their results), then the next user's"
)


def exchanges_of(history: Sequence[Said], answering_results: bool) -> list[SentExchange]:
    """The messages as the exchanges a ``Conversation`` keeps; ``answering_results``: the turn
    to answer is the results of the last reply's calls."""
    out: list[SentExchange] = []
    at = 0  # the next message
    while at < len(history):
        user = history[at]
        if not isinstance(user, UserSaid):
            raise InvalidParams(ORDER)
        at += 1
        rounds: list[tuple[ReplySaid, ResultsSaid]] = []
        while True:
            reply = history[at] if at < len(history) else None
            if reply is None and answering_results:
                raise InvalidParams(AFTER_CALLS)
            if not isinstance(reply, ReplySaid):
                raise InvalidParams(ORDER)
            at += 1
            if not reply.calls or (at == len(history) and answering_results):
                break
            results = history[at] if at < len(history) else None
            if not isinstance(results, ResultsSaid):
                raise InvalidParams("a reply's tool calls must be followed by their results")
            check_answers(reply.calls, results.results)
            rounds.append((reply, results))
            at += 1
        out.append(SentExchange(user, tuple(rounds), reply))
    if answering_results and not (out and out[-1].reply.calls):
        raise InvalidParams(AFTER_CALLS)
    return out


def _tokenized(
    conversation: Conversation, system: str | None, exchanges: list[SentExchange]
) -> tuple[list[int], list[tuple[list[int], list[ToolRound], list[int]]]]:
    """The system text's ids and each exchange's (user, tool rounds, reply) ids. Pure work on
    the tokenizer, for its worker thread."""
    system_ids = conversation.tokenize_system(system) if system else []
    tokenize = conversation.tokenize_user
    out: list[tuple[list[int], list[ToolRound], list[int]]] = []
    for sent in exchanges:
        rounds = [
            ToolRound(
                _reply_ids(conversation, reply), tokenize(results_text(reply.calls, said.results))
            )
            for reply, said in sent.rounds
        ]
        out.append((tokenize(sent.user.text), rounds, _reply_ids(conversation, sent.reply)))
    return system_ids, out


def _reply_ids(conversation: Conversation, reply: ReplySaid) -> list[int]:
    """A reply as the ids it was generated as, where known; else its text (and calls) as text."""
    if reply.ids is not None:
        return list(reply.ids)
    return conversation.tokenize_user(
        calls_text(reply.text, reply.calls) if reply.calls else reply.text
    )


async def _message_images(preparing: Preparing, said: UserSaid) -> list[Any]:
    """An earlier message's images as the session keeps them, checked as a prompt's are."""
    if not said.images:
        return []
    rules = preparing.image_rules()
    rules.require()
    rules.count(len(said.images), per="message")
    checked = await rules.check(said.images, preparing.image_checks)
    rules.budget(preparing.held_images(), checked, whose="the conversation's", advice="")
    return [image.image for image in checked]

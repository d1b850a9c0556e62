"""A request for a turn, checked: a prompt, a regenerate, tool results, an API request's
conversation or completion, read against the session's state (``SessionCore``: its limits, its
defaults, its staged images, its conversation, the ids it used) into the effect that prepares it
(``PrepareTurn``; an API conversation is loaded first: ``LoadConversation``). Each is a cell of
``SessionCore.RULES`` (core.py) that only reads: nothing of the session changes here (the handlers
that change it are the core's own). A refusal raises its typed error with the request's id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from wschat.protocol import GenerationParams, InvalidParams, Prompt, Regenerate, ToolResults

from .effects import (
    CompletionTurn,
    Effect,
    LoadConversation,
    PrepareTurn,
    PromptTurn,
    RegenerateTurn,
    ResultsTurn,
)
from .inputs import Complete, ConversationLoaded, Converse, ResultsSaid

if TYPE_CHECKING:
    from .core import SessionCore


def on_prompt(core: SessionCore, frame: Prompt) -> list[Effect]:
    return prompt(core, frame.id, frame.text, frame.images, frame.params)


def prompt(
    core: SessionCore,
    prompt_id: str,
    text: str,
    uploads: Sequence[bytes],
    params: GenerationParams | None,
) -> list[Effect]:
    check_unused(core, prompt_id)
    if not text and not uploads and not core.staged:
        raise InvalidParams("a prompt needs text or images", id=prompt_id)
    if core.chat.pending_calls:  # PROTOCOL.md "Tool calls": they are answered first
        raise InvalidParams("the last reply's tool calls await their results", id=prompt_id)
    limits = core.limits
    limits.check_text(text, prompt_id)
    merged = limits.merged(params, core.defaults, prompt_id)
    sampling, tools = limits.sampling(merged), limits.tools(merged, prompt_id)
    turn = PromptTurn(text, tuple(uploads), tuple(core.staged), sampling, tools)
    return [PrepareTurn(prompt_id, turn, bool(merged.token_ids))]


def on_regenerate(core: SessionCore, frame: Regenerate) -> list[Effect]:
    check_unused(core, frame.id)
    if not core.chat.turns:
        raise InvalidParams("the conversation holds no exchange to regenerate", id=frame.id)
    merged = core.limits.merged(frame.params, core.defaults, frame.id)
    turn = RegenerateTurn(core.limits.sampling(merged), core.limits.tools(merged, frame.id))
    return [PrepareTurn(frame.id, turn, bool(merged.token_ids))]


def on_tool_results(core: SessionCore, frame: ToolResults) -> list[Effect]:
    check_unused(core, frame.id)
    limits = core.limits
    limits.check_results(core.chat.pending_calls, frame.results, frame.id)
    merged = limits.merged(frame.params, core.defaults, frame.id)
    turn = ResultsTurn(frame.results, limits.sampling(merged), limits.tools(merged, frame.id))
    return [PrepareTurn(frame.id, turn, bool(merged.token_ids))]


def on_converse(core: SessionCore, request: Converse) -> list[Effect]:
    check_unused(core, request.id)
    said = [*request.history, request.user]
    for text in [request.system or "", *(text for s in said for text in s.texts)]:
        core.limits.check_text(text, what="a message's text")
    return [LoadConversation(request)]


def on_conversation_loaded(core: SessionCore, done: ConversationLoaded) -> list[Effect]:
    # the turn to answer, as a frame of a session that held the conversation
    request, user = done.request.conversation, done.request.conversation.user
    if isinstance(user, ResultsSaid):
        return on_tool_results(core, ToolResults(request.id, user.results, request.params))
    return prompt(core, request.id, user.text, user.images, request.params)


def on_complete(core: SessionCore, request: Complete) -> list[Effect]:
    check_unused(core, request.id)
    if not request.text and not request.ids:
        raise InvalidParams("a prompt needs text or token ids", id=request.id)
    limits = core.limits
    limits.check_text(request.text or "", request.id)
    merged = limits.merged(request.params, core.defaults, request.id)
    turn = CompletionTurn(request.text, request.ids, limits.sampling(merged))
    return [PrepareTurn(request.id, turn, bool(merged.token_ids))]


def check_unused(core: SessionCore, frame_id: str) -> None:
    if frame_id in core.used_ids:
        raise InvalidParams(f"id {frame_id!r} was already used in this session", id=frame_id)

"""When a reply stops, the same for every engine: its token budget, why it ended, and the
``Finished`` it ends with.

The budget is ``max_new_tokens`` cut to the room the context leaves after the prompt, and never
below one token (a prompt that fills the context still gets its one token: the session refuses
prompts that leave no room, and the engine may not hang on one). A reply ends cancelled before
anything else (the client asked), then stopped (an end token of the prompt format or a stop
string), then at its length (its budget spent, or the producer's own limit).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from wschat.protocol import FinishReason, Usage

if TYPE_CHECKING:
    from .base import Finished


def token_budget(max_new_tokens: int, context_tokens: int, prompt_tokens: int) -> int:
    """The most tokens a reply to a prompt of ``prompt_tokens`` may have."""
    return max(1, min(max_new_tokens, context_tokens - prompt_tokens))


def finish_reason(
    *, cancelled: bool, stopped: bool, produced: int, budget: int
) -> FinishReason | None:
    """Why the reply ends after its latest token, or None while it goes on."""
    if cancelled:
        return FinishReason.CANCELLED
    if stopped:
        return FinishReason.STOP
    if produced >= budget:
        return FinishReason.LENGTH
    return None


def final_reason(*, cancelled: bool, stopped: bool) -> FinishReason:
    """Why a reply ended that its producer ended (``generate`` returned, a stream finished):
    neither cancelled nor stopped, it ran into a length limit, ours or the producer's."""
    reason = finish_reason(cancelled=cancelled, stopped=stopped, produced=0, budget=0)
    return reason or FinishReason.LENGTH


def completed(
    end: Finished, *, text: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int
) -> Finished:
    """The ``Finished`` a reply ends with, as every engine hands it on: with the reply's whole
    text and its usage (the prompt's tokens, the reply's, those the engine had cached), unless
    its producer counted the usage itself."""
    usage = end.usage or Usage(prompt_tokens, completion_tokens, cached_tokens)
    return replace(end, text=text, usage=usage)

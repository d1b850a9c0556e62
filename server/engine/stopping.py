"""When a reply stops, the same for every engine: its token budget, the texts that end it, why
it ended, and the ``Finished`` it ends with.

The budget is ``max_new_tokens`` cut to the room the context leaves after the prompt, and never
below one token (a prompt that fills the context still gets its one token: the session refuses
prompts that leave no room, and the engine may not hang on one). A reply ends cancelled before
anything else (the client asked), then stopped (an end token of the prompt format, a stop string,
or a line that starts with one of the format's turn labels), then at its length (its budget
spent, or the producer's own limit).

``StopTexts`` is the text side of a stop, on the text an engine produces, wherever it comes
from: a stop string ends the reply where it begins (PROTOCOL.md: it is not part of the text); a
turn label (a transcript's ``User:``) ends it where a line starts with it, and neither the label
nor the line breaks before it are text. Text that could still grow into either is held back
until it is decided, so a client never sees a label stream and then vanish.
"""

from __future__ import annotations

from collections.abc import Sequence
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


class StopTexts:
    """Feeds a reply's text through: returns what is safe to show, and whether it has stopped.

    ``stops``: stop strings, anywhere in the text. ``labels``: turn labels, at the start of a
    line; a reply's line breaks are held back until the next text shows they start no label,
    and those it ends with are never shown, nor those it starts with (the reply starts on the
    label's line)."""

    def __init__(self, stops: Sequence[str] = (), labels: Sequence[str] = ()) -> None:
        self._stops = tuple(s for s in stops if s)
        self._labels = tuple(label for label in labels if label)
        self._held = ""
        self._shown = False  # a reply's leading line breaks are no text (labels only)
        self.hit = False

    def feed(self, text: str) -> str:
        """What of ``text`` (after what was held) may be shown now."""
        if self.hit:
            return ""
        window = self._held + text
        cut = self._cut(window)
        if cut is not None:
            self.hit = True
            self._held = ""
            return self._show(window[:cut])
        keep = self._held_from(window)
        self._held = window[keep:]
        return self._show(window[:keep])

    def flush(self) -> str:
        """What was held, once the reply ended without a stop: its last line breaks left out."""
        held, self._held = self._held, ""
        if self.hit:
            return ""
        return self._show(held.rstrip("\n") if self._labels else held)

    def _show(self, text: str) -> str:
        if self._labels and not self._shown:
            text = text.lstrip("\n")
        self._shown = self._shown or bool(text)
        return text

    def _cut(self, window: str) -> int | None:
        """Where the first stop in ``window`` cuts it, or None."""
        cuts = [i for i in (window.find(s) for s in self._stops) if i >= 0]
        for label in self._labels:
            at = window.find("\n" + label)
            if at >= 0:
                cuts.append(len(window[: at + 1].rstrip("\n")))
        return min(cuts) if cuts else None

    def _held_from(self, window: str) -> int:
        """Where the tail that could still become a stop begins (``len(window)``: none)."""
        keep = len(window)
        longest = max((len(s) for s in self._stops), default=1) - 1
        for size in range(min(len(window), longest), 0, -1):
            if any(s.startswith(window[-size:]) for s in self._stops):
                keep = len(window) - size
                break
        line = window.rfind("\n")
        if self._labels and line >= 0:
            start = window[line + 1 :]
            if any(label.startswith(start) for label in self._labels):
                keep = min(keep, len(window[: line + 1].rstrip("\n")))
        return keep

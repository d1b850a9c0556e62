"""A reply's text as it streams, read as tools.py lays out calls: ``CallReader`` holds back text
that may begin a call (``{"tool_calls": [`` after any blank space), shows a text reply as it
comes, and hands out each call of a calling reply once its JSON object is whole, with the id
``read_calls`` gives the same call in the whole reply.

A call is whole when its object parses (``json.JSONDecoder.raw_decode`` from where it starts)
and names an offered tool; the whole reply's reading (``read_calls``) decides what it was. A
whole call whose arguments do not match its tool's schema raises ``CallArgumentsInvalid`` from
``feed`` or ``finish``: the reply fails (sessions/generation.py).
Text the reader held back that never began a call is shown when the reply ends (``finish``); a
reply that began a call and is no whole calls' object (cut by its budget or a cancel, or broken)
shows none of it: a call's text is never reply text (PROTOCOL.md note 23). The calls whole
before the cut were handed out; the reply ends with its own reason, not ``tool_calls``.
"""

from __future__ import annotations

from .grammar_close import reserve_for
from .tools import CALLS_OPENING, CallsInvalid, FunctionCall, ToolUse, next_call, read_calls


class CallReader:
    """One reply's reader. Not thread-safe: the run that streams the reply drives it."""

    def __init__(self, use: ToolUse | None, seed: str) -> None:
        self._use = use if use is not None and use.may_call else None
        self._seed = seed
        self._held = ""  # text not shown yet: it may begin a call, or it is one
        self._calling = False  # the reply began a call
        self._at = 0  # where the next call's object starts in ``_held``
        self.calls: list[FunctionCall] = []  # handed out so far
        self._budget: int | None = None  # the reply's tokens (``limit``)
        self._ended_at = 0.0  # the reply's tokens when its last call was whole (estimated)
        self._longest = 0.0  # the most tokens one call took, its separator included

    def limit(self, budget: int) -> None:
        """The reply may have ``budget`` tokens: see ``full``."""
        self._budget = budget

    @property
    def full(self) -> bool:
        """Whether a reply that may write several calls has no room for one more as long as
        its longest before its last ``reserve_for(budget)`` tokens (those a JSON reply in this
        process spends closing itself: grammar_close.py). The reader then hands out no more
        calls, and the reply ends after those it did (``Chat.end_after_calls``), on every
        engine, rather than cut in its next call."""
        budget = self._budget
        if budget is None or self._use is None or not self._use.parallel or not self.calls:
            return False
        return self._ended_at + self._longest > budget - reserve_for(budget)

    def feed(self, text: str, produced: int = 0) -> tuple[str, list[FunctionCall]]:
        """The text to show now, and the calls that are whole now; ``produced``: the reply's
        tokens so far, this text's included (what ``full`` weighs)."""
        if self._use is None:
            return text, []
        self._held += text
        if not self._calling:
            begun = self._held.lstrip()
            if CALLS_OPENING.startswith(begun):
                return "", []  # it may still begin a call
            if not begun.startswith(CALLS_OPENING):
                shown, self._held, self._use = self._held, "", None  # a text reply
                return shown, []
            self._calling = True
            self._at = self._held.index(CALLS_OPENING) + len(CALLS_OPENING)
        return "", self._whole_calls(produced)

    def finish(self) -> tuple[str, list[FunctionCall], bool]:
        """At the reply's end: the text still to show, the calls not handed out yet, and
        whether the reply is a call (every call handed out then, none shown as text)."""
        if not self._calling:
            shown, self._held = self._held, ""
            return shown, [], False
        try:
            calls = read_calls(self._held, self._use, self._seed) or ()
        except CallsInvalid:  # cut short (its budget, a cancel), or broken: no text, no more calls
            self._held = ""
            return "", [], False
        rest = list(calls[len(self.calls) :])
        self.calls += rest
        return "", rest, True

    def _whole_calls(self, produced: int) -> list[FunctionCall]:
        """The calls whose object ended since the last look, until the reply is ``full``; the
        tokens since the last look shared among them evenly (a piece may hold several)."""
        assert self._use is not None
        whole: list[tuple[FunctionCall, int]] = []
        at = self._at
        while True:
            index = len(self.calls) + len(whole)
            try:  # not whole yet, or no call: ``finish`` says what it was
                call, at = next_call(self._held, at, self._use, self._seed, index)
            except CallsInvalid:
                break
            whole.append((call, at))
        found: list[FunctionCall] = []
        each = (produced - self._ended_at) / len(whole) if whole else 0.0
        for call, end in whole:
            if self.full:
                break
            self._longest = max(self._longest, each)
            self._ended_at += each
            self._at = end
            self.calls.append(call)
            found.append(call)
        return found

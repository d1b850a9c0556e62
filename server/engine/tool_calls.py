"""A reply's text as it streams, read as tools.py lays out calls: ``CallReader`` holds back text
that may begin a call (``{"tool_calls": [`` after any blank space), shows a text reply as it
comes, and hands out each call of a calling reply once its JSON object is whole, with the id
``read_calls`` gives the same call in the whole reply.

A call is whole when its object parses (``json.JSONDecoder.raw_decode`` from where it starts)
and names an offered tool; the whole reply's reading (``read_calls``) decides what it was.
Text the reader held back that never began a call is shown when the reply ends (``finish``); a
reply that began a call and is no whole calls' object (cut by its budget or a cancel, or broken)
shows none of it: a call's text is never reply text (PROTOCOL.md note 23). The calls whole
before the cut were handed out; the reply ends with its own reason, not ``tool_calls``.
"""

from __future__ import annotations

import json

from .tools import CALLS_OPENING, CallsInvalid, FunctionCall, ToolUse, call_id, dumps, read_calls

_DECODER = json.JSONDecoder()


class CallReader:
    """One reply's reader. Not thread-safe: the run that streams the reply drives it."""

    def __init__(self, use: ToolUse | None, seed: str) -> None:
        self._use = use if use is not None and use.may_call else None
        self._seed = seed
        self._held = ""  # text not shown yet: it may begin a call, or it is one
        self._calling = False  # the reply began a call
        self._at = 0  # where the next call's object starts in ``_held``
        self._names = {tool.name for tool in self._use.callable()} if self._use else set()
        self.calls: list[FunctionCall] = []  # handed out so far

    def feed(self, text: str) -> tuple[str, list[FunctionCall]]:
        """The text to show now, and the calls that are whole now."""
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
        return "", self._whole_calls()

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

    def _whole_calls(self) -> list[FunctionCall]:
        """The calls whose object ended since the last look."""
        found: list[FunctionCall] = []
        text = self._held
        while True:
            at = self._at
            while at < len(text) and text[at] in ", \n":
                at += 1
            try:
                item, end = _DECODER.raw_decode(text, at)
            except ValueError:
                return found
            name = item.get("name") if isinstance(item, dict) else None
            arguments = item.get("arguments") if isinstance(item, dict) else None
            if name not in self._names or not isinstance(arguments, dict):
                return found  # not a call: ``finish`` says what the reply was
            call = FunctionCall(call_id(self._seed, len(self.calls)), str(name), dumps(arguments))
            self.calls.append(call)
            found.append(call)
            self._at = end

"""Token-id prefixes: how many ids two sequences share from the start (``common_prefix``), and
what each owner itself sent an engine (``OwnPrefixes``).

An engine whose prefix cache every client shares (llama.cpp's server, SGLang's: no salt) counts
as cached whatever prefix any client left, so its count would tell one owner what another sent:
a guess that reads one more token from the cache is right. What an owner may be told is bounded
by the longest prefix of its prompt that it sent itself. That record is bounded in ids, with a
share per owner (``shares``); a prefix it no longer holds is reported as not cached, never the
other way round.
"""

from __future__ import annotations

import itertools
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from .shares import share_victim

_BLOCK = 256
# ids kept for all owners together (4 bytes each: 16 MiB)
OWN_IDS = 1 << 22
# sequences kept per owner: the most a prompt is compared with (each one conversation)
OWN_SEQUENCES = 32


def common_prefix(a: array[int], b: array[int]) -> int:
    """How many ids ``a`` and ``b`` share from the start: the whole of the shorter at once (a
    conversation that goes on), else blocks compared in C, then one by one."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


class OwnPrefixes:
    """The id sequences each owner sent an engine (its prompts, and each with its reply: what
    the engine may keep for it), the least recently sent given up first."""

    def __init__(self, max_ids: int = OWN_IDS, per_owner: int = OWN_SEQUENCES) -> None:
        self.max_ids = max_ids
        self.per_owner = per_owner
        # by owner, its sequences by when each was last sent (a stamp of ``_clock``), oldest first
        self._sent: dict[str, OrderedDict[int, array[int]]] = {}
        self._held: dict[str, int] = {}  # ids per owner
        self._clock = itertools.count()

    @property
    def ids(self) -> int:
        return sum(self._held.values())

    def add(self, owner: str, ids: Sequence[int]) -> int:
        """``owner`` sends ``ids``: how many of them it sent before, from the start. They are
        kept from now on; a kept sequence they extend says nothing more and goes, and one that
        extends them already says it all. So no kept sequence is a prefix of another, and one
        that goes on from the last sent (a reply after its prompt, a conversation's next turn)
        shares with no other more than with that one: it is compared with that one alone."""
        sequence = array("i", ids)
        sent: OrderedDict[int, array[int]] = self._sent.get(owner) or OrderedDict()
        last = next(reversed(sent.items()), None)
        if last is not None and common_prefix(last[1], sequence) == len(last[1]):
            self._drop(owner, last[0])
            self._keep(owner, sequence)
            return len(last[1])
        known = 0
        for stamp, kept in list(sent.items()):
            shared = common_prefix(kept, sequence)
            known = max(known, shared)
            if shared == len(sequence):  # a prefix of a kept one: that one, sent again now
                sequence = kept
                self._drop(owner, stamp)
            elif shared == len(kept):
                self._drop(owner, stamp)
        self._keep(owner, sequence)
        return known

    def _keep(self, owner: str, sequence: array[int]) -> None:
        if not sequence or len(sequence) > self.max_ids:
            return
        sent = self._sent.setdefault(owner, OrderedDict())
        sent[next(self._clock)] = sequence
        self._held[owner] = self._held.get(owner, 0) + len(sequence)
        while len(sent) > self.per_owner:
            self._drop(owner, next(iter(sent)))
        self._fit()

    def _fit(self) -> None:
        while sum(self._held.values()) > self.max_ids:
            oldest = sorted((next(iter(s)), owner) for owner, s in self._sent.items() if s)
            victim = share_victim(((place, place[1]) for place in oldest), self._held)
            assert victim is not None  # over the bound: something is held
            self._drop(victim[1], victim[0])

    def _drop(self, owner: str, stamp: int) -> None:
        sent = self._sent[owner]
        self._held[owner] -= len(sent.pop(stamp))
        if not sent:
            del self._sent[owner], self._held[owner]

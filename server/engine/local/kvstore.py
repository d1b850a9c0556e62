"""Per-session KV caches kept between turns, under one byte budget across sessions and engines.

A session's next prompt usually extends the token ids its cache holds, so prefill covers only
the new tokens. After a rewind, a regenerate or an edited message it shares only a prefix with
them: the engine cuts the cache back to that prefix (``shared_length``), where its sliding
layers allow it (``window_holds``), and prefills the rest. Caches of sessions not generating
sit here; when the bytes they hold exceed the budget, the ring marks of the least recently used
go first, then the least recently used are evicted (their sessions re-prefill on their next
prompt). One store serves both transformers paths (the
batch and ``generate``, batched.py): each entry keeps the form its engine made, and an engine
that finds another's form drops it.

Besides the sessions' entries it keeps a few openings (``put_opening``): the KV state of the ids
every conversation with one prompt format and system prompt starts with
(``GenerationRequest.opening``), shared read-only by every session of its scope
(``GenerationRequest.opening_scope``: everyone's without a system prompt, its owner's with one)
whose prompt starts with them: a new session prefills only what follows its opening. Past
their limit an owner's system prompts evict its own openings (``shares``), and the one without
a system prompt goes last.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base import KVUsage
from ..shares import share_victim

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class RingMark:
    """The sliding layers' keys and values as they were at ``length`` positions, a turn
    boundary: the state a generation started from. Past the window a cut-back cache's own ring
    no longer holds what an earlier position reads (``window_holds``), but a mark at or before
    it does; full layers hold every position, so they are cut back instead (``latest_mark``).
    The tensors are the loaded state's own, which nothing writes to afterwards (the batch
    copies a state into its buffers, ``generate`` concatenates into new tensors): no copy."""

    length: int
    ring: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per sliding layer, the cache's form
    ring_from: int  # the first position the ring holds

    def tensors(self) -> Iterator[torch.Tensor]:
        return (t for pair in self.ring for t in pair)


# Openings the store keeps at once by default (--shared-openings): one per system prompt in use
SHARED_OPENINGS = 4
# An opening shorter than this is not kept: its prefill costs next to nothing (gemma-turns
# without a system prompt opens with 4 ids).
MIN_OPENING_TOKENS = 8


@dataclass(slots=True)
class CachedPrefix:
    cache: Any  # a transformers Cache (HFEngine) or a KVState (BatchedEngine)
    ids: list[int]  # exactly the tokens whose KV state the cache holds
    nbytes: int  # what its keys and values hold in memory, its marks' included
    marks: tuple[RingMark, ...] = ()  # by length, each at most len(ids)
    marks_nbytes: int = field(default=0)  # what the marks alone add to nbytes
    # An opening of the store's, read by many sessions at once: an engine loads it by copy and
    # never writes, cuts or marks its tensors (the state it leaves is its own).
    shared: bool = False

    def drop_marks(self) -> int:
        """Give up the ring marks; the bytes that frees."""
        freed = self.marks_nbytes
        self.nbytes -= freed
        self.marks, self.marks_nbytes = (), 0
        return freed


def cached_prefix(
    cache: Any,
    ids: list[int],
    tensors: Iterable[torch.Tensor],
    marks: Iterable[RingMark] = (),
    *,
    shared: bool = False,
) -> CachedPrefix:
    """An entry of ``cache`` (its keys and values ``tensors``) and ``marks``, their bytes
    counted once where they share storage."""
    own, marks = list(tensors), tuple(marks)
    cache_bytes = held_bytes(own)
    total = held_bytes([*own, *(t for mark in marks for t in mark.tensors())])
    return CachedPrefix(cache, ids, total, marks, total - cache_bytes, shared)


def carried_marks(prefix: CachedPrefix | None, ring: RingMark | None) -> tuple[RingMark, ...]:
    """The marks of the state a generation leaves: those of the state it started from
    (``prefix``, already cut back to what it reused), and that state's ring (``ring``, at
    ``len(prefix.ids)``), the boundary an edit or a regenerate of this turn goes back to."""
    if prefix is None or ring is None:
        return ()
    if ring.ring_from == 0:  # within the window it holds every earlier mark's positions too
        return (ring,)
    return (*(m for m in prefix.marks if m.length < ring.length), ring)


def latest_mark(marks: Sequence[RingMark], length: int, window: int) -> tuple[RingMark, int] | None:
    """Where a cache cut back to ``length`` has lost what that position reads: the mark to go
    back to and the length it serves, the longest. A mark taken within the window holds every
    position from the first, so it serves any length up to its own; one past it, only its own
    (what its next position reads)."""
    best: tuple[RingMark, int] | None = None
    for mark in marks:
        if mark.ring_from == 0:
            served = min(length, mark.length)
        elif mark.length <= length and window_holds(mark.ring_from, mark.length, window):
            served = mark.length
        else:
            continue
        if best is None or served > best[1]:
            best = (mark, served)
    return best


def held_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storage behind ``tensors``: a view (a sliding window cut out of a longer
    prefill) keeps all of its storage alive, so its own size would undercount."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def shared_length(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens ``prompt`` shares with ``cached``, short of the prompt's last:
    a generation prefills at least that one, whose logits pick its first token."""
    limit = min(len(cached), len(prompt) - 1)
    if limit > 0 and cached[limit - 1] == prompt[limit - 1] and cached[:limit] == prompt[:limit]:
        return limit  # the common case: the prompt extends the cache
    n = 0
    while n < limit and cached[n] == prompt[n]:
        n += 1
    return n


def window_holds(first_held: int, length: int, window: int) -> bool:
    """Whether a sliding layer that holds the positions from ``first_held`` on still holds
    every one that position ``length`` reads, the ``window - 1`` before it: the rule for cutting
    a cache back to its first ``length`` tokens.

    Where it does not hold, the lost positions' keys would be recomputed from the hidden states
    of the layers below, and every sliding layer below reaches another ``window - 1`` positions
    back: the prompt from ``length - sliding_layers * (window - 1)`` on, in practice all of it.
    So the cache is not reused at all.
    """
    return first_held <= max(0, length - window + 1)


class KVStore:
    def __init__(self, budget_bytes: int, openings: int = SHARED_OPENINGS) -> None:
        self.budget_bytes = budget_bytes
        self.openings = openings  # the most openings kept at once (0: none)
        # guards _entries and _openings: the loop takes/puts, worker threads put back when
        # they finish
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, CachedPrefix] = OrderedDict()
        # by scope and ids: a session is handed only an opening of its own scope
        self._openings: OrderedDict[tuple[str, tuple[int, ...]], CachedPrefix] = OrderedDict()
        self.evictions = 0

    def _held(self) -> list[CachedPrefix]:
        return [*self._entries.values(), *self._openings.values()]

    @property
    def tokens(self) -> int:
        return self.usage().tokens

    @property
    def bytes(self) -> int:
        return self.usage().bytes

    def usage(self) -> KVUsage:
        """What the sessions' entries and the openings hold together."""
        with self._lock:
            held = self._held()
        tokens = sum(len(e.ids) for e in held)
        return KVUsage(tokens, sum(e.nbytes for e in held), self.budget_bytes)

    def take(
        self, key: str, prompt_ids: list[int], kind: type | tuple[type, ...], scope: str = ""
    ) -> CachedPrefix | None:
        """The session's cache if it is of ``kind`` and the prompt starts with at least one of
        its tokens, unless an opening of ``kind`` and ``scope`` that the prompt starts with is
        longer: then that opening (``shared``), which stays in the store for other sessions.
        The session's own leaves the store either way. It may hold more than the prompt
        shares: the engine cuts it back (``shared_length``)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            own = 0
            if entry is not None and isinstance(entry.cache, kind):
                own = shared_length(entry.ids, prompt_ids)
            opening = self._longest_opening(prompt_ids, kind, scope)
            if opening is not None and len(opening.ids) > own:
                self._openings.move_to_end((scope, tuple(opening.ids)))
                return opening
        return entry if own else None

    def _longest_opening(
        self, prompt_ids: list[int], kind: type | tuple[type, ...], scope: str
    ) -> CachedPrefix | None:
        best: CachedPrefix | None = None
        for (held_by, ids), opening in self._openings.items():
            longer = best is None or len(ids) > len(best.ids)
            fits = len(ids) < len(prompt_ids) and isinstance(opening.cache, kind)
            if held_by == scope and longer and fits and prompt_ids[: len(ids)] == opening.ids:
                best = opening
        return best

    def sessions(self) -> dict[str, CachedPrefix]:
        """Each session's entry by its key, the least recently used first (a copy)."""
        with self._lock:
            return dict(self._entries)

    def shared_openings(self) -> dict[tuple[str, tuple[int, ...]], CachedPrefix]:
        """The openings kept, by scope and ids, the least recently used first (a copy)."""
        with self._lock:
            return dict(self._openings)

    def has_opening(self, ids: Sequence[int], scope: str = "") -> bool:
        with self._lock:
            return (scope, tuple(ids)) in self._openings

    def put(self, key: str, entry: CachedPrefix) -> None:
        if entry.nbytes - entry.marks_nbytes > self.budget_bytes:
            return
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._fit()

    def put_opening(self, entry: CachedPrefix, scope: str = "") -> None:
        """Keep ``entry`` (no marks) as an opening shared by every session of ``scope`` whose
        prompt starts with its ids; one already kept for them stays as it is. Past ``openings``
        of them, all scopes together, one goes (``_opening_victim``)."""
        if self.openings <= 0 or entry.nbytes > self.budget_bytes:
            return
        entry.shared = True
        key = (scope, tuple(entry.ids))
        with self._lock:
            if key in self._openings:
                return
            self._openings[key] = entry
            while len(self._openings) > self.openings:
                del self._openings[self._opening_victim()]
            self._fit()

    def _opening_victim(self) -> tuple[str, tuple[int, ...]]:
        """The opening that goes when there are too many (the lock held): the least recently
        used of the owner (scope) holding the most, so that an owner's system prompts evict its
        own; the one without a system prompt, everyone's, only where no other is left."""
        held = Counter(scope for scope, _ in self._openings)
        owned = [(key, key[0]) for key in self._openings if key[0]]
        victim = share_victim(owned or [(key, key[0]) for key in self._openings], held)
        assert victim is not None  # over the limit: something is kept
        return victim

    def _fit(self) -> None:
        """Under the budget again (the lock held). Over it, marks go before any entry (a whole
        entry's at once, the least recently used first): an entry serves its session's every
        next prompt, a mark only a prompt cut back past the window. Then the sessions' entries,
        and the openings last: an opening serves every new session with its system prompt, an
        entry one session."""
        total = sum(e.nbytes for e in self._held())
        for held in self._entries.values():
            if total <= self.budget_bytes:
                break
            total -= held.drop_marks()
        # the entry just put (the most recent) goes last of all: it fits the budget alone
        for pool, keep in ((self._entries, 1), (self._openings, 0), (self._entries, 0)):
            while total > self.budget_bytes and len(pool) > keep:
                _, evicted = pool.popitem(last=False)
                total -= evicted.nbytes
                self.evictions += 1

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

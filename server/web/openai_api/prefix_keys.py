"""``CacheKeys``: the session keys API requests run under, so that a conversation resent whole
finds the KV state its last request left.

An HTTP request has no session: each one runs under one of a bounded set of engine session keys,
the one whose last request's ids (its prompt and reply: what the engine keeps for that key) share
the longest prefix with the new prompt. The engine's KV store holds the state under its one
budget (``--kv-budget-mib``), evicting the least recently used across sessions and these keys
alike; this index only says which key to try. A key serves one request at a time, and only
requests of the same owner (the bearer token): whether a prefix is cached says something about
what another client sent. The keys are shared per owner (``engine/shares.py``): once they run
out, the owner that holds the most gives up its least recently used.
"""

from __future__ import annotations

import secrets
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...engine import common_prefix, share_victim

# Keys kept: each remembers at most a context of ids (4 bytes each)
MAX_KEYS = 128


@dataclass(slots=True)
class _Entry:
    owner: str
    ids: array[int] = field(default_factory=lambda: array("i"))
    busy: bool = False


class CacheKeys:
    def __init__(self, forget: Callable[[str], None], max_keys: int = MAX_KEYS) -> None:
        self._forget = forget  # the engine's: drop what it keeps for a key
        self.max_keys = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def acquire(self, owner: str, prompt_ids: Sequence[int]) -> str:
        """The free key of ``owner`` that ``prompt_ids`` goes on from: one it extends first (no
        cut), then the longest prefix shared, more than half of what the key holds; else a new
        key. It is busy until ``release``."""
        prompt = array("i", prompt_ids)
        best, best_score = None, (False, 0)
        for key, entry in self._entries.items():
            if entry.owner == owner and not entry.busy:
                n = common_prefix(entry.ids, prompt)
                # another conversation that shares a beginning (a system prompt) would cut this
                # one's state back to it: a key is taken only by a prompt that goes on from
                # most of what it holds (a next turn, a regenerate, a late edit); and a key the
                # prompt extends beats a longer one it would cut back, which a sliding window
                # may not allow (the engine then prefills all and the longer state is lost)
                score = (n >= len(entry.ids) - 1, n)
                if 2 * n > len(entry.ids) and score > best_score:
                    best, best_score = key, score
        if best is None:
            best = self._new_key(owner)
        entry = self._entries[best]
        entry.busy = True
        self._entries.move_to_end(best)
        return best

    def of(self, owner: str) -> OwnerKeys:
        """The keys as one owner's session takes them (``sessions.session.EngineKeys``)."""
        return OwnerKeys(self, owner)

    def release(self, key: str, ids: Sequence[int] | None) -> None:
        """The request under ``key`` is over: the engine now keeps ``ids`` for it (None: nothing
        worth keeping, a failed reply)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.busy = False
        if ids is None:
            self._entries.pop(key)
            self._forget(key)
        else:
            entry.ids = array("i", ids)

    def _new_key(self, owner: str) -> str:
        if len(self._entries) >= self.max_keys:
            held = Counter(entry.owner for entry in self._entries.values())
            held[owner] += 1  # the key it takes now
            idle = ((k, e.owner) for k, e in self._entries.items() if not e.busy)
            # the least recently used of the owner holding the most: a client's many requests
            # evict its own keys, not another's; all busy: one more for a while
            victim = share_victim(idle, held)
            if victim is not None:
                self._entries.pop(victim)
                self._forget(victim)
        key = f"api-{secrets.token_hex(8)}"
        self._entries[key] = _Entry(owner)
        return key


@dataclass(frozen=True, slots=True)
class OwnerKeys:
    """``CacheKeys`` as the session of one owner's request takes them."""

    keys: CacheKeys
    owner: str

    def acquire(self, prompt_ids: Sequence[int]) -> str:
        return self.keys.acquire(self.owner, prompt_ids)

    def release(self, key: str, ids: Sequence[int] | None) -> None:
        self.keys.release(key, ids)

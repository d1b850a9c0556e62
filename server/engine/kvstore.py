"""Per-session KV caches kept between turns, under one token budget across sessions.

A session's next prompt extends the token ids its cache holds, so prefill covers only the new
tokens. Caches of sessions not generating sit here; when the budget is exceeded the least
recently used are evicted first (their sessions re-prefill on their next prompt).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class CachedPrefix:
    cache: Any  # a transformers Cache
    ids: list[int]  # exactly the tokens whose KV state the cache holds


class KVStore:
    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        # guards _entries: the loop takes/puts, worker threads put back when they finish
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, CachedPrefix] = OrderedDict()
        self.evictions = 0

    @property
    def tokens(self) -> int:
        with self._lock:
            return sum(len(e.ids) for e in self._entries.values())

    def take(self, key: str, prompt_ids: list[int]) -> CachedPrefix | None:
        """The session's cache if the prompt extends what it holds; it leaves the store."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is None:
            return None
        n = len(entry.ids)
        if n == 0 or n >= len(prompt_ids) or prompt_ids[:n] != entry.ids:
            return None
        return entry

    def put(self, key: str, entry: CachedPrefix) -> None:
        if len(entry.ids) > self.budget_tokens:
            return
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            total = sum(len(e.ids) for e in self._entries.values())
            while total > self.budget_tokens and self._entries:
                _, evicted = self._entries.popitem(last=False)
                total -= len(evicted.ids)
                self.evictions += 1

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

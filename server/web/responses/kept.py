"""``KeptResponses``: the responses kept (``store``, its default) for ``GET /v1/responses/{id}``
and ``previous_response_id``, each its owner's alone.

Each is kept with its whole conversation (the texts, the ids each reply was generated as, the
images), so a continuation renders exactly as the conversation the engine last saw. Bounded three
ways (``--responses-kept``, ``--responses-kept-mib``, ``--responses-kept-s``): a response kept
past its time is gone; past the count or the bytes, the owner (bearer token) that holds the most
gives up its least recently used (``engine/shares.py``), so one client's many responses never
push out another's. A response counts its conversation whole, though a continuation shares its
messages with the response before it: what is counted is at least what is held.

An owner asking for another owner's response is told what it would be told of one that never
existed.
"""

from __future__ import annotations

import json
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...engine import share_victim
from ...sessions import ReplySaid, Said, UserSaid

# What a kept response costs besides its bytes: its entry, its object's dicts, its messages'.
ENTRY_BYTES = 1024
MESSAGE_BYTES = 128
ID_BYTES = 4  # a token id, as an array of int32 would hold it


@dataclass(frozen=True, slots=True)
class Kept:
    """A response as it ended: its owner, its object (what GET answers) and its conversation
    (the system text of its input's first items, not its instructions, which no continuation
    takes; then its messages, its output last)."""

    id: str
    owner: str
    body: dict[str, Any]
    system: str | None
    said: tuple[Said, ...]
    # the bytes it is counted as holding: counted once, though a socket sums its lanes' at
    # every response's end and the store at every add
    size: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        said = sum(_said_bytes(s) for s in self.said)
        system = len((self.system or "").encode())
        shape = len(json.dumps(self.body, separators=(",", ":")))
        object.__setattr__(self, "size", ENTRY_BYTES + system + said + shape)


def _said_bytes(said: Said) -> int:
    text = MESSAGE_BYTES + sum(len(t.encode()) for t in said.texts)
    if isinstance(said, UserSaid):
        return text + sum(len(image) for image in said.images)
    if isinstance(said, ReplySaid):
        return text + ID_BYTES * len(said.ids or ())
    return text


@dataclass(slots=True)
class _KeptEntry:
    kept: Kept
    size: int
    ends_at: float


class KeptResponses:
    def __init__(
        self,
        most: int,
        most_bytes: int,
        keep_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most = most
        self.most_bytes = most_bytes
        self.keep_s = keep_s
        self._clock = clock
        self._kept: OrderedDict[str, _KeptEntry] = OrderedDict()  # least recently used first
        # (when it ends, its id), oldest first; an id dropped before its end is passed over
        self._ends: deque[tuple[float, str]] = deque()
        self._held: Counter[str] = Counter()  # responses kept, by owner
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, response_id: str, owner: str) -> Kept | None:
        """The owner's response ``response_id``; None when it is not kept, or not its."""
        self._expire()
        entry = self._kept.get(response_id)
        if entry is None or entry.kept.owner != owner:
            return None
        self._kept.move_to_end(response_id)
        return entry.kept

    def add(self, kept: Kept) -> bool:
        """Keep ``kept`` (another of its id goes); False when it alone is over the bytes."""
        self._expire()
        self._drop(kept.id)
        size = kept.size
        if size > self.most_bytes or self.most < 1:
            return False
        self._held[kept.owner] += 1  # the one it is about to take, as share_victim counts
        while self._kept and (len(self._kept) >= self.most or self.bytes + size > self.most_bytes):
            places = ((i, e.kept.owner) for i, e in self._kept.items())
            victim = share_victim(places, self._held)
            assert victim is not None  # some are kept
            self._drop(victim)
        ends_at = self._clock() + self.keep_s
        self._kept[kept.id] = _KeptEntry(kept, size, ends_at)
        self.bytes += size
        self._ends.append((ends_at, kept.id))
        if len(self._ends) > 2 * len(self._kept) + 16:  # ends of ids dropped since: let go
            self._ends = deque(sorted((e.ends_at, i) for i, e in self._kept.items()))
        return True

    def delete(self, response_id: str, owner: str) -> bool:
        """False when the owner has no such response kept."""
        if self.get(response_id, owner) is None:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        entry = self._kept.pop(response_id, None)
        if entry is None:
            return
        self.bytes -= entry.size
        owner = entry.kept.owner
        self._held[owner] -= 1
        if self._held[owner] <= 0:
            del self._held[owner]

    def _expire(self) -> None:
        now = self._clock()
        while self._ends and self._ends[0][0] <= now:
            ends_at, response_id = self._ends.popleft()
            entry = self._kept.get(response_id)
            if entry is not None and entry.ends_at == ends_at:
                self._drop(response_id)

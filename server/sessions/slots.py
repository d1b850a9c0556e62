"""``GenerationSlots``: at most N generations at once across sessions, a bounded queue after,
shared fairly between client addresses.

A waiting ticket learns its place (1 = next) whenever it changes, so the session can send
``queued`` frames (PROTOCOL.md "Server frames").

Fair share (README "Security and limits"): one address alone may take every slot and every
place in the queue, but not keep them from others. The queue is served by rounds, not by
arrival: an address's k-th waiting prompt comes after every other address's earlier ones
(running ones counted), so a slot that frees goes to the address running the fewest. And when
the queue is full, a prompt from an address holding less than its share (running + queued
places over the addresses holding any, the newcomer's included) pushes out the newest waiting
prompt of the address furthest over its share, which ends ``overloaded``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

from wschat.protocol import Overloaded


class Ticket:
    def __init__(self, owner: str = "", seq: int = 0) -> None:
        self.owner = owner  # the client address whose share it counts against
        self.seq = seq  # arrival order
        self.granted = False  # a slot is its (set once, before moved)
        self.moved = asyncio.Event()  # set by GenerationSlots whenever position changes
        self.position = 0
        self.released = False
        # why it left the queue without a slot (pushed out for a fair share), set before moved
        self.pushed_out: Overloaded | None = None


class GenerationSlots:
    def __init__(self, max_concurrent: int, max_queue: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.running = 0
        self._waiting: list[Ticket] = []  # in the order they will be granted
        self._running_by: Counter[str] = Counter()
        self._seq = itertools.count()
        self.closed_reason: str | None = None

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def enqueue(self, owner: str = "") -> Ticket:
        """A ticket for ``owner`` (a client address), granted at once when a slot is free;
        ``overloaded`` when the queue is full and ``owner`` is not owed room in it."""
        if self.closed_reason is not None:
            raise Overloaded(self.closed_reason)
        ticket = Ticket(owner, next(self._seq))
        if self.running < self.max_concurrent and not self._waiting:
            self._grant(ticket)
            return ticket
        if len(self._waiting) >= self.max_queue:
            victim = self._over_share(owner)
            if victim is None:
                raise Overloaded(
                    f"the server is at capacity ({self.max_queue} prompts already waiting)"
                )
            self._push_out(victim)
        self._waiting.append(ticket)
        self._reorder()
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give the slot back (granted ticket) or leave the queue (waiting ticket); idempotent."""
        if ticket.released:
            return
        ticket.released = True
        if ticket in self._waiting:
            self._waiting.remove(ticket)
            self._reorder()
            return
        if ticket.pushed_out is not None:
            return
        self.running -= 1
        self._running_by[ticket.owner] -= 1
        if self._running_by[ticket.owner] <= 0:
            del self._running_by[ticket.owner]  # bounded by the addresses running now
        while self._waiting and self.running < self.max_concurrent:
            self._grant(self._waiting.pop(0))
            self._reorder()  # the next round: the granted address runs one more
        self._reorder()

    def _grant(self, ticket: Ticket) -> None:
        self.running += 1
        self._running_by[ticket.owner] += 1
        ticket.position = 0
        ticket.granted = True
        ticket.moved.set()

    def _over_share(self, newcomer: str) -> Ticket | None:
        """The newest waiting ticket of the address furthest over its share, when ``newcomer``
        holds less than its own; else None."""
        held = Counter(self._running_by)
        held.update(t.owner for t in self._waiting)
        owners = len(held) + (newcomer not in held)
        share = max(1, (self.max_concurrent + self.max_queue) // owners)
        if held[newcomer] >= share:
            return None
        over = [t for t in self._waiting if t.owner != newcomer and held[t.owner] > share]
        # the most held first; between addresses holding as many, the newest prompt
        return max(over, key=lambda t: (held[t.owner], t.seq), default=None)

    def _push_out(self, ticket: Ticket) -> None:
        self._waiting.remove(ticket)
        ticket.position = 0
        ticket.pushed_out = Overloaded(
            "the server is at capacity and this address holds more than its share of it:"
            " a queued prompt made room for another address's"
        )
        ticket.moved.set()

    def _reorder(self) -> None:
        """Rounds: a ticket's round is its address's running count plus the tickets of that
        address ahead of it; lower rounds first, arrival order within a round."""
        ahead: Counter[str] = Counter()
        rounds: dict[Ticket, int] = {}
        for ticket in sorted(self._waiting, key=lambda t: t.seq):
            rounds[ticket] = self._running_by[ticket.owner] + ahead[ticket.owner]
            ahead[ticket.owner] += 1
        self._waiting.sort(key=lambda t: (rounds[t], t.seq))
        for place, ticket in enumerate(self._waiting, start=1):
            if ticket.position != place:
                ticket.position = place
                ticket.moved.set()

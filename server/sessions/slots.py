"""``GenerationSlots``: at most N generations at once across sessions, a bounded FIFO queue after.

A waiting ticket learns its place (1 = next) whenever it changes, so the session can send
``queued`` frames (PROTOCOL.md "Server frames").
"""

from __future__ import annotations

import asyncio
from collections import deque

from wschat.protocol import Overloaded


class Ticket:
    def __init__(self) -> None:
        self.granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.moved = asyncio.Event()  # set by GenerationSlots whenever position changes
        self.position = 0
        self.released = False


class GenerationSlots:
    def __init__(self, max_concurrent: int, max_queue: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.running = 0
        self._waiting: deque[Ticket] = deque()
        self.closed_reason: str | None = None

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def enqueue(self) -> Ticket:
        """A ticket, granted at once when a slot is free; ``overloaded`` when the queue is full."""
        if self.closed_reason is not None:
            raise Overloaded(self.closed_reason)
        ticket = Ticket()
        if self.running < self.max_concurrent and not self._waiting:
            self.running += 1
            ticket.granted.set_result(None)
            return ticket
        if len(self._waiting) >= self.max_queue:
            raise Overloaded(
                f"the server is at capacity ({self.max_queue} prompts already waiting)"
            )
        self._waiting.append(ticket)
        ticket.position = len(self._waiting)
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give the slot back (granted ticket) or leave the queue (waiting ticket); idempotent."""
        if ticket.released:
            return
        ticket.released = True
        if ticket in self._waiting:
            self._waiting.remove(ticket)
            self._renumber()
            return
        self.running -= 1
        while self._waiting and self.running < self.max_concurrent:
            nxt = self._waiting.popleft()
            self.running += 1
            nxt.position = 0
            nxt.granted.set_result(None)
            nxt.moved.set()
        self._renumber()

    def _renumber(self) -> None:
        for place, ticket in enumerate(self._waiting, start=1):
            if ticket.position != place:
                ticket.position = place
                ticket.moved.set()

"""Per-server and per-connection quotas: connection caps and the frame rate.

uvicorn's ``--limit-concurrency`` counts HTTP requests, not open WebSockets, so the app keeps
its own count of connections, in total and per client address.
"""

from __future__ import annotations

import time
from collections import Counter, deque


class ConnectionCaps:
    """Places per server and per client address. A connection takes one; a reply held after
    its connection dropped (``hold``) keeps it until the reply ends or is taken back, so that
    dropping connections cannot run more replies than the caps allow open connections. A
    resume may take one place over the caps for each place its address holds that way: it is
    taking one of those replies back, which gives that place up."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self._by_client: Counter[str] = Counter()
        self._held: Counter[str] = Counter()  # of those, the places held replies keep

    def acquire(self, client: str, resuming: bool = False) -> str | None:
        """Count a new connection; or say (as a close reason) why there is no room for it."""
        held = self._held[client] if resuming else 0
        if self.total >= self.max_total + held:
            return f"the server is full ({self.max_total} connections)"
        if self._by_client[client] >= self.max_per_client + held:
            return f"too many connections from this address ({self.max_per_client})"
        self.total += 1
        self._by_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        self._by_client[client] -= 1
        if self._by_client[client] <= 0:
            del self._by_client[client]  # the counter must not grow with every address seen

    def hold(self, client: str) -> None:
        """A connection's place is kept by its held reply from now on (``release_held``)."""
        self._held[client] += 1

    def release_held(self, client: str) -> None:
        self._held[client] -= 1
        if self._held[client] <= 0:
            del self._held[client]
        self.release(client)

    @property
    def clients(self) -> int:
        return len(self._by_client)


class FrameRate:
    """More than ``per_second`` frames within any one second is a flood.

    Keeps the arrival times of the last ``per_second`` frames (bounded memory): a flood is a
    new frame arriving less than a second after the oldest of them.
    """

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self._arrivals: deque[float] = deque(maxlen=max(per_second, 1))

    def allow(self, now: float | None = None) -> bool:
        if self.per_second <= 0:
            return True
        now = time.monotonic() if now is None else now
        full = len(self._arrivals) == self._arrivals.maxlen
        if full and now - self._arrivals[0] < 1.0:
            return False
        self._arrivals.append(now)
        return True

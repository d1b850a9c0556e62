"""Per-server and per-connection quotas: connection caps and the frame rate.

uvicorn's ``--limit-concurrency`` counts HTTP requests, not open WebSockets, so the app keeps
its own count of connections, in total and per client address. An address is counted as its
``address_group``: an IPv6 address as its /64, which one subscriber holds whole.
"""

from __future__ import annotations

import ipaddress
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable

# An IPv6 subscriber is routed a /64 (or more): counted per address, it could open 2**64 of them.
IPV6_GROUP_PREFIX = 64


def address_group(address: str) -> str:
    """What the per-address caps count ``address`` as: an IPv6 address as its /64, an
    IPv4-mapped one as the IPv4 address; anything else (IPv4, "unknown") as it is."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # a link-local's zone aside
    except ValueError:
        return address
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, IPV6_GROUP_PREFIX), strict=False))


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
        client = address_group(client)
        held = self._held[client] if resuming else 0
        if self.total >= self.max_total + held:
            return f"the server is full ({self.max_total} connections)"
        if self._by_client[client] >= self.max_per_client + held:
            return f"too many connections from this address ({self.max_per_client})"
        self.total += 1
        self._by_client[client] += 1
        return None

    def release(self, client: str) -> None:
        client = address_group(client)
        self.total -= 1
        self._by_client[client] -= 1
        if self._by_client[client] <= 0:
            del self._by_client[client]  # the counter must not grow with every address seen

    def hold(self, client: str) -> None:
        """A connection's place is kept by its held reply from now on (``release_held``)."""
        self._held[address_group(client)] += 1

    def release_held(self, client: str) -> None:
        self.release(client)
        client = address_group(client)
        self._held[client] -= 1
        if self._held[client] <= 0:
            del self._held[client]

    @property
    def clients(self) -> int:
        return len(self._by_client)


class PendingPlace:
    """One connection's place among the pending handshakes; ``drop`` closes the connection."""

    __slots__ = ("client", "drop", "order", "released")

    def __init__(self, client: str, drop: Callable[[], None], order: int) -> None:
        self.client, self.drop, self.order = client, drop, order
        self.released = False


class PendingHandshakes:
    """Connections still sending their HTTP request: at most ``max_total``. One address alone
    may take every place, but not keep them from others: when all are taken, a newcomer from an
    address that holds fewer than ``share`` places, and fewer than the address holding the
    most, takes the place of that address's oldest connection, which is dropped. Any other
    newcomer is refused. Places are counted when a connection arrives, before it has sent a
    byte, so a refusal by a fixed share per address would cut a burst of connections a client
    opens at once (an SDK's ``gather`` of requests); this one only cuts under contention."""

    def __init__(self, max_total: int, share: int) -> None:
        self.max_total = max_total
        self.share = share
        self.total = 0
        self.dropped_for_newcomers = 0
        # each address's places, oldest first (a dict keeps insertion order)
        self._by_client: dict[str, dict[PendingPlace, None]] = {}
        self._arrivals = itertools.count()

    def acquire(self, client: str, drop: Callable[[], None]) -> PendingPlace | str:
        """A place for a connection from ``client``; or why there is none."""
        client = address_group(client)
        held = len(self._by_client.get(client, ()))
        if self.total >= self.max_total:
            if held >= self.share:
                return (
                    f"all {self.max_total} taken, and this address holds its share ({self.share})"
                )
            places = max(self._by_client.values(), key=_size_then_age, default={})
            if len(places) <= held:
                return f"all {self.max_total} taken"
            oldest = next(iter(places))
            self.release(oldest)
            self.dropped_for_newcomers += 1
            oldest.drop()
        place = PendingPlace(client, drop, next(self._arrivals))
        self._by_client.setdefault(client, {})[place] = None
        self.total += 1
        return place

    def release(self, place: PendingPlace) -> None:
        """The connection's request arrived whole, or the connection is gone (once is enough)."""
        if place.released:
            return
        place.released = True
        self.total -= 1
        held = self._by_client[place.client]
        del held[place]
        if not held:
            del self._by_client[place.client]  # no entry for every address seen

    def held_by(self, client: str) -> int:
        return len(self._by_client.get(address_group(client), ()))


def _size_then_age(places: dict[PendingPlace, None]) -> tuple[int, int]:
    """The most places first; between equals, the one whose oldest place is oldest."""
    return len(places), -next(iter(places)).order


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

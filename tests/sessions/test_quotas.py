"""The per-address quotas (sessions/quotas.py): what an address counts as, the connection caps
per address group, and the pending handshakes' places, shares and evictions."""

from __future__ import annotations

import pytest
from wschat.server.sessions.quotas import (
    ConnectionCaps,
    PendingHandshakes,
    PendingPlace,
    address_group,
)


@pytest.mark.parametrize(
    ("address", "group"),
    [
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),
        ("2001:DB8:0001:0002:0:0:0:1", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("::1", "::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("192.0.2.1", "192.0.2.1"),
        ("127.0.0.2", "127.0.0.2"),
        ("unknown", "unknown"),
        ("", ""),
    ],
)
def test_an_ipv6_address_counts_as_its_64_and_others_as_themselves(
    address: str, group: str
) -> None:
    assert address_group(address) == group


def test_the_connection_caps_count_an_ipv6_64_as_one_address() -> None:
    caps = ConnectionCaps(max_total=10, max_per_client=2)
    assert caps.acquire("2001:db8:1:2::1") is None
    assert caps.acquire("2001:db8:1:2::2") is None
    assert caps.acquire("2001:db8:1:2::3") == "too many connections from this address (2)"
    assert caps.acquire("2001:db8:1:3::1") is None
    caps.release("2001:db8:1:2::1")
    assert caps.acquire("2001:db8:1:2:ffff::9") is None
    assert caps.clients == 2


def take(pending: PendingHandshakes, client: str, dropped: list[str], name: str) -> PendingPlace:
    place = pending.acquire(client, lambda: dropped.append(name))
    assert isinstance(place, PendingPlace), place
    return place


def test_one_address_may_take_every_place_while_no_one_else_wants_one() -> None:
    pending = PendingHandshakes(max_total=4, share=1)
    dropped: list[str] = []
    for n in range(4):
        take(pending, "10.0.0.1", dropped, f"a{n}")
    refused = pending.acquire("10.0.0.1", lambda: None)
    assert refused == "all 4 taken, and this address holds its share (1)"
    assert (pending.total, pending.held_by("10.0.0.1"), dropped) == (4, 4, [])


def test_a_newcomer_takes_the_oldest_place_of_the_address_holding_the_most() -> None:
    pending = PendingHandshakes(max_total=5, share=2)
    dropped: list[str] = []
    for n in range(2):
        take(pending, "10.0.0.1", dropped, f"a{n}")
    for n in range(3):
        take(pending, "10.0.0.2", dropped, f"b{n}")
    take(pending, "10.0.0.3", dropped, "c0")  # full: b (3 places) gives its oldest
    take(pending, "10.0.0.3", dropped, "c1")  # a and b hold 2 each: a's oldest is older
    assert dropped == ["b0", "a0"]
    assert [pending.held_by(f"10.0.0.{n}") for n in (1, 2, 3)] == [1, 2, 2]
    assert pending.dropped_for_newcomers == 2


def test_an_address_holding_its_share_takes_no_other_place_once_all_are_taken() -> None:
    pending = PendingHandshakes(max_total=4, share=1)
    dropped: list[str] = []
    for n in range(3):
        take(pending, "10.0.0.1", dropped, f"a{n}")
    take(pending, "10.0.0.2", dropped, "b0")  # a free place: no share applies
    refused = pending.acquire("10.0.0.2", lambda: None)
    assert refused == "all 4 taken, and this address holds its share (1)"
    assert dropped == []


def test_a_newcomer_holding_as_many_as_any_other_takes_nothing() -> None:
    pending = PendingHandshakes(max_total=2, share=8)
    dropped: list[str] = []
    take(pending, "10.0.0.1", dropped, "a0")
    take(pending, "10.0.0.2", dropped, "b0")
    assert pending.acquire("10.0.0.2", lambda: None) == "all 2 taken"
    assert dropped == []


def test_a_place_is_released_once_and_its_address_forgotten() -> None:
    pending = PendingHandshakes(max_total=2, share=1)
    dropped: list[str] = []
    place = take(pending, "2001:db8::1", dropped, "a0")
    assert pending.held_by("2001:db8::2") == 1  # the same /64
    pending.release(place)
    pending.release(place)  # the connection's end after its request arrived: no second count
    assert (pending.total, pending.held_by("2001:db8::1")) == (0, 0)


def test_no_places_refuses_every_connection() -> None:
    refused = PendingHandshakes(max_total=0, share=1).acquire("10.0.0.1", lambda: None)
    assert refused == "all 0 taken"

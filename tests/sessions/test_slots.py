"""``GenerationSlots``: N at once, a bounded queue after, shared fairly between addresses. One
address alone may take every slot and every place; another address that finds the queue full
pushes out the newest waiting prompt of the address furthest over its share; a freed slot goes
to the waiting address that runs the fewest."""

from __future__ import annotations

import pytest
from wschat.protocol import Overloaded
from wschat.server.sessions.slots import GenerationSlots, Ticket


def granted(tickets: list[Ticket]) -> list[bool]:
    return [t.granted for t in tickets]


async def test_one_address_alone_takes_every_slot_and_every_place_in_the_queue() -> None:
    slots = GenerationSlots(2, 3)
    mine = [slots.enqueue("a") for _ in range(5)]
    assert granted(mine) == [True, True, False, False, False]
    assert [t.position for t in mine[2:]] == [1, 2, 3]
    with pytest.raises(Overloaded):  # nobody else is owed room: as full as before
        slots.enqueue("a")


async def test_a_full_queue_makes_room_for_another_address_by_its_newest_prompt() -> None:
    slots = GenerationSlots(2, 3)
    hog = [slots.enqueue("a") for _ in range(5)]
    other = slots.enqueue("b")
    newest = hog[-1]
    assert newest.pushed_out is not None and newest.moved.is_set()
    assert all(t.pushed_out is None for t in hog[:-1])
    # "b" runs nothing: it is next, ahead of "a"'s earlier prompts
    assert other.position == 1
    assert [t.position for t in hog[2:4]] == [2, 3]
    slots.release(newest)  # its run ends: it held no slot
    assert slots.running == 2 and slots.queued == 3


async def test_an_address_at_its_share_pushes_nobody_out() -> None:
    slots = GenerationSlots(1, 3)  # 4 places: a share of 2 for each of two addresses
    a = [slots.enqueue("a") for _ in range(2)]
    b = [slots.enqueue("b") for _ in range(2)]
    with pytest.raises(Overloaded):
        slots.enqueue("b")  # "b" holds its share
    assert all(t.pushed_out is None for t in [*a, *b])
    # a third address: a share of 1, which "a" and "b" are both over; the newest prompt goes
    c = slots.enqueue("c")
    assert b[1].pushed_out is not None
    assert all(t.pushed_out is None for t in [*a, b[0]])
    assert c.position == 2  # with "b"'s first (neither runs one; "b"'s came first), before "a"'s


async def test_a_freed_slot_goes_to_the_address_running_the_fewest() -> None:
    slots = GenerationSlots(2, 8)
    running = [slots.enqueue("a"), slots.enqueue("a")]
    waiting_a = [slots.enqueue("a") for _ in range(3)]
    waiting_b = slots.enqueue("b")
    assert waiting_b.position == 1  # "a" runs two, "b" none
    slots.release(running[0])
    assert waiting_b.granted
    assert [t.position for t in waiting_a] == [1, 2, 3]
    slots.release(running[1])
    assert waiting_a[0].granted

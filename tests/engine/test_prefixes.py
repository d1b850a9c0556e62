"""``OwnPrefixes`` (engine/prefixes.py): what each owner sent an engine whose prefix cache every
client shares, bounded in ids with a share per owner; and ``share_victim`` (engine/shares.py),
the rule for that share."""

from __future__ import annotations

from array import array

from wschat.server.engine import common_prefix, share_victim
from wschat.server.engine.prefixes import OwnPrefixes


def test_an_owner_is_told_only_of_the_prefix_it_sent_itself() -> None:
    own = OwnPrefixes()
    assert own.add("a", [1, 2, 3, 4]) == 0
    assert own.add("b", [1, 2, 3, 9]) == 0  # what "a" sent is not "b"'s
    assert own.add("a", [1, 2, 3, 4, 5, 6]) == 4
    assert own.add("b", [1, 2, 7]) == 2
    assert own.add("a", [1, 2]) == 2


def test_a_conversation_that_goes_on_is_kept_once() -> None:
    own = OwnPrefixes()
    for n in range(1, 10):
        own.add("a", list(range(10 * n)))
    assert own.ids == 90
    own.add("a", list(range(5)))  # a prefix of what is kept: nothing more to keep
    assert own.ids == 90


def test_the_owner_holding_the_most_gives_up_its_oldest_first() -> None:
    own = OwnPrefixes(max_ids=30)
    own.add("a", [1] * 10)
    for n in range(2, 5):  # "b" sends three conversations of 10: one more than the bound holds
        own.add("b", [n] * 10)
    assert own.add("a", [1] * 10) == 10  # "a"'s survived "b"'s flood
    assert own.add("b", [4] * 10) == 10
    assert own.add("b", [2] * 10) == 0  # "b"'s oldest went


def test_an_owner_keeps_at_most_its_share_of_sequences() -> None:
    own = OwnPrefixes(per_owner=2)
    for n in range(3):
        own.add("a", [n, n])
    assert own.add("a", [0, 0, 1]) == 0 and own.add("a", [2, 2, 1]) == 2


def test_common_prefix_counts_the_ids_shared_from_the_start() -> None:
    long = array("i", range(1000))
    assert common_prefix(long, array("i", range(600))) == 600
    assert common_prefix(long, array("i", [*range(700), -1])) == 700
    assert common_prefix(array("i"), long) == 0


def test_a_share_victim_is_the_oldest_place_of_the_owner_holding_the_most() -> None:
    places = [("a1", "a"), ("b1", "b"), ("b2", "b")]
    assert share_victim(places, {"a": 1, "b": 2}) == "b1"
    assert share_victim(places, {"a": 2, "b": 2}) == "a1"  # among equals, the oldest
    assert share_victim([], {"a": 1}) is None

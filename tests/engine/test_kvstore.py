"""``KVStore``'s budget on plain tensors: an entry's bytes are its cache's and its ring marks',
and marks are given up before any entry is."""

from __future__ import annotations

import torch
from wschat.server.engine.local.kvstore import (
    CachedPrefix,
    KVStore,
    RingMark,
    cached_prefix,
    carried_marks,
    latest_mark,
)

COLUMN = 4 * 8  # bytes of one float32 column of 8 values


def tensors(columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(8, columns), torch.zeros(8, columns)


def entry(columns: int, marks: int = 0) -> CachedPrefix:
    """A cache of ``columns`` positions, with ``marks`` ring marks of 2 columns each."""
    own = tensors(columns)
    ringed = [RingMark(i + 1, (tensors(2),), 0) for i in range(marks)]
    return cached_prefix(own, list(range(columns)), own, ringed)


def test_an_entrys_bytes_are_its_caches_and_its_marks() -> None:
    store = KVStore(1 << 20)
    store.put("a", entry(10, marks=3))
    assert store.bytes == 2 * 10 * COLUMN + 3 * 2 * 2 * COLUMN
    assert store.usage().bytes == store.bytes


def test_a_store_over_budget_drops_marks_least_recent_first_before_evicting() -> None:
    marks = 3 * 2 * 2 * COLUMN
    one = 2 * 10 * COLUMN + marks  # an entry of 10 positions and 3 marks
    store = KVStore(3 * one - 1)
    for key in "abc":
        store.put(key, entry(10, marks=3))
    # over by a byte: the marks of "a" go, all at once, and nothing else
    assert [len(store.sessions()[k].marks) for k in "abc"] == [0, 3, 3]
    assert store.bytes == 3 * one - marks and store.evictions == 0
    store.put("d", entry(10, marks=3))  # the marks of "b", then of "c"
    assert [len(store.sessions()[k].marks) for k in "abcd"] == [0, 0, 0, 3]
    assert store.evictions == 0
    store.put("e", entry(10, marks=3))  # every entry's marks, and still over: "a" goes
    assert store.evictions == 1 and list(store.sessions()) == ["b", "c", "d", "e"]
    assert all(not e.marks for e in store.sessions().values())
    assert store.bytes == 4 * (one - marks) <= store.budget_bytes


def test_an_entry_over_budget_with_its_marks_is_kept_without_them() -> None:
    store = KVStore(2 * 10 * COLUMN + 2 * 2 * COLUMN)
    store.put("a", entry(10, marks=3))
    assert set(store.sessions()) == {"a"} and not store.sessions()["a"].marks
    assert store.bytes == 2 * 10 * COLUMN


WINDOW = 16


def mark(length: int) -> RingMark:
    """A mark as a ring of ``WINDOW`` columns is at ``length`` positions."""
    return RingMark(length, (tensors(min(length, WINDOW)),), max(0, length - WINDOW))


def test_a_cut_goes_back_to_the_longest_length_a_mark_serves() -> None:
    marks = [mark(10), mark(40), mark(60)]
    # past the window a mark serves its own length; within it, any length up to its own
    found = [latest_mark(marks, n, WINDOW) for n in (50, 30, 7)]
    assert [(m.length, served) for m, served in filter(None, found)] == [
        (40, 40),
        (10, 10),
        (10, 7),
    ]
    assert latest_mark([mark(40)], 39, WINDOW) is None


def test_a_mark_within_the_window_stands_for_every_earlier_one() -> None:
    start = entry(12, marks=0)
    start.marks = (mark(5), mark(9))
    assert [m.length for m in carried_marks(start, mark(12))] == [12]  # it holds 0-11
    start.marks = (mark(5), mark(30))
    assert [m.length for m in carried_marks(start, mark(40))] == [5, 30, 40]


# -- openings: shared by every session whose prompt starts with them --------------------------


def opening(ids: list[int]) -> CachedPrefix:
    own = tensors(len(ids))
    return cached_prefix(own, ids, own)


def session(ids: list[int]) -> CachedPrefix:
    own = tensors(len(ids))
    return cached_prefix(own, ids, own)


def test_a_new_session_gets_the_longest_opening_its_prompt_starts_with_and_it_stays() -> None:
    store = KVStore(1 << 20)
    store.put_opening(opening([1, 2, 3]))
    store.put_opening(opening([1, 2, 3, 4, 5]))
    store.put_opening(opening([7, 8, 9]))
    prompt = [1, 2, 3, 4, 5, 6]
    for key in ("a", "b"):
        taken = store.take(key, prompt, tuple)
        assert taken is not None and taken.shared and taken.ids == [1, 2, 3, 4, 5]
    assert store.has_opening([1, 2, 3, 4, 5]) and store.tokens == 3 + 5 + 3
    # an opening as long as the prompt leaves nothing to prefill: it is not handed out
    assert store.take("c", [1, 2, 3], tuple) is None
    shorter = store.take("c", [1, 2, 3, 4], tuple)
    assert shorter is not None and shorter.ids == [1, 2, 3]
    assert store.take("c", [2, 1, 3, 4], tuple) is None
    assert store.take("c", prompt, list) is None  # another engine's form


def test_a_session_keeps_its_own_entry_where_it_shares_as_much_as_the_opening() -> None:
    store = KVStore(1 << 20)
    store.put_opening(opening([1, 2, 3, 4]))
    store.put("s", session([1, 2, 3, 4, 10, 11]))
    own = store.take("s", [1, 2, 3, 4, 10, 11, 12], tuple)
    assert own is not None and not own.shared and own.ids == [1, 2, 3, 4, 10, 11]
    store.put("s", session([1, 2, 3, 9, 9]))  # a rewind: 3 shared, the opening has 4
    taken = store.take("s", [1, 2, 3, 4, 12], tuple)
    assert taken is not None and taken.shared
    assert "s" not in store.sessions()  # what the session had leaves the store either way
    store.put("s", session([1, 2, 3, 4, 9]))  # as much as the opening: its own
    taken = store.take("s", [1, 2, 3, 4, 12], tuple)
    assert taken is not None and not taken.shared


def test_openings_are_bounded_in_count_the_least_recently_used_going_first() -> None:
    store = KVStore(1 << 20, openings=2)
    store.put_opening(opening([1, 1]))
    store.put_opening(opening([2, 2]))
    assert store.take("s", [1, 1, 5], tuple) is not None  # [1, 1] is the most recently used
    store.put_opening(opening([3, 3]))
    assert list(store.shared_openings()) == [("", (1, 1)), ("", (3, 3))]
    kept = store.shared_openings()[("", (1, 1))]
    store.put_opening(opening([1, 1]))  # one copy per opening: the first stays
    assert store.shared_openings()[("", (1, 1))] is kept
    off = KVStore(1 << 20, openings=0)
    off.put_opening(opening([1, 1]))
    assert not off.has_opening([1, 1]) and off.bytes == 0


def test_openings_count_in_the_budget_and_go_after_the_sessions_entries() -> None:
    one = 2 * 10 * COLUMN
    store = KVStore(3 * one)
    store.put_opening(opening(list(range(10))))
    assert store.bytes == one and store.usage().tokens == 10
    store.put("a", session(list(range(100, 110))))
    store.put("b", session(list(range(200, 210))))
    assert store.bytes == 3 * one
    store.put_opening(opening(list(range(300, 310))))  # over: a session's entry goes first
    assert set(store.sessions()) == {"b"} and len(store.shared_openings()) == 2
    store.put("c", entry(20))  # over again: "b", then the least recently used opening
    assert set(store.sessions()) == {"c"} and list(store.shared_openings()) == [
        ("", tuple(range(300, 310)))
    ]
    assert store.bytes == 3 * one and store.evictions == 3
    store.put_opening(opening(list(range(400, 440))))  # bigger than the whole budget
    assert not store.has_opening(list(range(400, 440)))


def test_an_opening_serves_only_requests_of_its_scope() -> None:
    store = KVStore(1 << 20)
    prompt = [1, 2, 3, 4, 5]
    store.put_opening(opening([1, 2, 3]), "alice")
    assert store.has_opening([1, 2, 3], "alice") and not store.has_opening([1, 2, 3])
    assert store.take("b", prompt, tuple, "bob") is None  # the same ids, another owner
    assert store.take("p", prompt, tuple) is None  # nor everyone's
    mine = store.take("a", prompt, tuple, "alice")
    assert mine is not None and mine.shared and mine.ids == [1, 2, 3]
    # one without a system prompt is everyone's (scope ""): any session with scope "" gets it
    store.put_opening(opening([1, 2, 3, 4]))
    for key in ("p", "q"):
        public = store.take(key, prompt, tuple)
        assert public is not None and public.ids == [1, 2, 3, 4]
    # the same ids under two scopes: two openings, each handed to its own scope only
    store.put_opening(opening([1, 2, 3]), "bob")
    assert len(store.shared_openings()) == 3
    bobs = store.take("b", prompt, tuple, "bob")
    assert bobs is not None and bobs is store.shared_openings()[("bob", (1, 2, 3))]
    assert bobs is not mine


def test_an_owners_openings_evict_its_own_and_the_one_without_a_system_prompt_stays() -> None:
    store = KVStore(1 << 20, openings=4)
    store.put_opening(entry(10))  # everyone's: no system prompt
    store.put_opening(entry(11), "alice")
    for columns in range(12, 16):  # bob's four system prompts
        store.put_opening(entry(columns), "bob")
    assert [(scope, len(ids)) for scope, ids in store.shared_openings()] == [
        ("", 10),
        ("alice", 11),
        ("bob", 14),
        ("bob", 15),
    ]
    store.put_opening(entry(16), "carol")  # under its share: bob, over his, gives one up
    assert [(scope, len(ids)) for scope, ids in store.shared_openings()][2:] == [
        ("bob", 15),
        ("carol", 16),
    ]

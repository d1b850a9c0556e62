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
    assert [len(store._entries[k].marks) for k in "abc"] == [0, 3, 3]
    assert store.bytes == 3 * one - marks and store.evictions == 0
    store.put("d", entry(10, marks=3))  # the marks of "b", then of "c"
    assert [len(store._entries[k].marks) for k in "abcd"] == [0, 0, 0, 3]
    assert store.evictions == 0
    store.put("e", entry(10, marks=3))  # every entry's marks, and still over: "a" goes
    assert store.evictions == 1 and list(store._entries) == ["b", "c", "d", "e"]
    assert all(not e.marks for e in store._entries.values())
    assert store.bytes == 4 * (one - marks) <= store.budget_bytes


def test_an_entry_over_budget_with_its_marks_is_kept_without_them() -> None:
    store = KVStore(2 * 10 * COLUMN + 2 * 2 * COLUMN)
    store.put("a", entry(10, marks=3))
    assert set(store._entries) == {"a"} and not store._entries["a"].marks
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

"""``KeptResponses`` (web/responses/kept.py): each owner's alone, bounded in count, in bytes and
in time, and past a bound the owner holding the most gives up its least recently used."""

from __future__ import annotations

from wschat.server.sessions import ReplySaid, UserSaid
from wschat.server.web.responses.kept import ENTRY_BYTES, Kept, KeptResponses


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def kept(response_id: str, owner: str = "a", text: str = "hi") -> Kept:
    said = (UserSaid(text), ReplySaid("ok", (1, 2)))
    return Kept(response_id, owner, {"id": response_id}, None, said)


def test_a_response_is_its_owners_alone() -> None:
    store = KeptResponses(10, 1 << 20, 60)
    store.add(kept("r1", owner="a"))
    assert store.get("r1", "b") is None
    assert store.delete("r1", "b") is False
    assert store.get("r1", "a") == kept("r1", owner="a")
    assert store.delete("r1", "a") is True
    assert store.get("r1", "a") is None and len(store) == 0 and store.bytes == 0


def test_past_the_count_the_owner_holding_the_most_gives_up_its_least_recently_used() -> None:
    store = KeptResponses(4, 1 << 20, 60)
    for response_id, owner in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]:
        store.add(kept(response_id, owner))
    store.get("a1", "a")  # a1 used: a2 is now a's least recently used
    store.add(kept("b2", "b"))
    assert [r for r in ("a1", "a2", "a3") if store.get(r, "a")] == ["a1", "a3"]
    assert store.get("b1", "b") is not None and store.get("b2", "b") is not None
    assert len(store) == 4


def test_past_the_bytes_responses_go_and_one_over_them_alone_is_not_kept() -> None:
    size = kept("r0").size
    store = KeptResponses(100, 3 * size, 60)
    for n in range(5):
        assert store.add(kept(f"r{n}"))
    assert len(store) == 3 and store.bytes == 3 * size
    assert [n for n in range(5) if store.get(f"r{n}", "a")] == [2, 3, 4]
    huge = kept("big", text="x" * (3 * size))
    assert huge.size > ENTRY_BYTES + 3 * size
    assert store.add(huge) is False and store.get("big", "a") is None and len(store) == 3


def test_a_response_is_gone_once_its_time_is_over() -> None:
    clock = Clock()
    store = KeptResponses(10, 1 << 20, 60, clock)
    store.add(kept("old"))
    clock.now = 30
    store.add(kept("new"))
    clock.now = 60
    assert store.get("old", "a") is None
    assert store.get("new", "a") is not None
    clock.now = 90
    assert store.get("new", "a") is None and len(store) == 0 and store.bytes == 0


def test_a_response_kept_again_replaces_itself_and_its_end() -> None:
    clock = Clock()
    store = KeptResponses(10, 1 << 20, 60, clock)
    for n in range(100):
        clock.now = n
        store.add(kept("same"))
    assert len(store) == 1 and store.bytes == kept("same").size
    clock.now = 120
    assert store.get("same", "a") is not None  # its first ends passed over: its last holds
    clock.now = 159
    assert store.get("same", "a") is None

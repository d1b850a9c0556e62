"""A share per owner of a bounded set of places (the API's prefix keys, the conversations'
openings, what each owner sent an unsalted engine): when the places run out, the owner that holds
the most gives one up, its least recently used. So an owner at or over its share evicts its
own before anyone else's, and no owner's traffic flushes another's places: otherwise one client
sending many short requests would take from every other client what their conversations had
cached."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

Place = TypeVar("Place", bound=Hashable)


def share_victim(candidates: Iterable[tuple[Place, str]], held: Mapping[str, int]) -> Place | None:
    """Of ``candidates`` (the places that may go, least recently used first, each with its
    owner), the first of an owner that holds the most (``held``: what each owner holds, its
    busy places and the one it is about to take included); None when there is none."""
    listed = list(candidates)
    if not listed:
        return None
    most = max(held.get(owner, 0) for _, owner in listed)
    return next(place for place, owner in listed if held.get(owner, 0) == most)

"""Replies to one prompt (a request's ``n`` choices): the first to come prefills it, the others
wait for it and start from a copy of its state and the logits of its last prompt token, so the
prompt is prefilled once however many replies it gets. Each reply keeps its own sampler (its
own seed), grammar and logprobs.

Two requests are siblings when their prompts are the same ids and they may share cached state:
the same owner (``cache_scope``, ``opening_scope``), no images. A sibling that comes once the
first has fed its prompt prefills on its own (the first's state is no longer the prompt's alone).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..base import GenerationRequest

if TYPE_CHECKING:
    from .rows import BatchRow

SiblingKey = tuple[tuple[int, ...], str, str]


def sibling_key(request: GenerationRequest) -> SiblingKey | None:
    """What makes two requests siblings; None for one that has none (images)."""
    if request.images:
        return None
    return tuple(request.prompt_ids), request.cache_scope, request.opening_scope


class Siblings:
    """The rows whose prompt is being prefilled, each with the siblings waiting for it. The
    event loop joins rows (``join``), the worker lets them go (``release``)."""

    def __init__(self) -> None:
        self._leading: dict[SiblingKey, BatchRow] = {}
        self._lock = threading.Lock()  # guards _leading and each leader's followers
        self.joined = 0  # rows that started from a sibling's prefill (the tests' count)

    def join(self, row: BatchRow) -> bool:
        """Whether ``row`` waits for a sibling's prefill (else it leads its own)."""
        key = sibling_key(row.request)
        if key is None:
            return False
        with self._lock:
            leader = self._leading.get(key)
            if leader is None:
                self._leading[key] = row
                row.sibling_key = key
                return False
            leader.followers.append(row)
            self.joined += 1
            return True

    def release(self, leader: BatchRow) -> list[BatchRow]:
        """The rows that waited for ``leader``, which leads no more (its prompt is fed, or it
        ended before)."""
        with self._lock:
            if leader.sibling_key is not None and self._leading.get(leader.sibling_key) is leader:
                del self._leading[leader.sibling_key]
            leader.sibling_key = None
            followers, leader.followers = leader.followers, []
        return followers

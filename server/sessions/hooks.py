"""What a session (session.py) calls out to as it goes, given at its construction (hub.py): the
store's and the stats' hooks, and the engine session keys its runs go under."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .session import Session


def _ignore(session: Session) -> None:
    return None


def _ignore_rewind(regenerate: bool) -> None:
    return None


@dataclass(frozen=True, slots=True)
class SessionHooks:
    """Each turn boundary (``boundary``: done, configure, reset, rewound, image_ok, a reply's
    start; the store saves), the running reply growing (``progress``: the store checkpoints it),
    and each rewind answered (False) or regenerate accepted (True) (``on_rewind``:
    ``ServerStats.count_rewind``). An HTTP API request's session has none."""

    boundary: Callable[[Session], None] = _ignore
    progress: Callable[[Session], None] = _ignore
    on_rewind: Callable[[bool], None] = _ignore_rewind


class EngineKeys(Protocol):
    """The engine session key each run goes under, and what the engine keeps under it once the
    run ended (None: nothing worth keeping): the HTTP API's (web/openai_api/prefix_keys.py). A
    chat's runs go under its own key."""

    def acquire(self, prompt_ids: Sequence[int]) -> str: ...

    def release(self, key: str, ids: Sequence[int] | None) -> None: ...

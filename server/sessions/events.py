"""What a generation run tells its listeners (the session, ``ServerStats``, ``Metrics``), as
it happens: one ``RunStarted`` when it gets a slot, a ``TokensSent`` per ``token`` frame (or
piece of a tool call's text, which goes as its ``tool_call`` frame), one ``RunDone`` with the
``done`` frame it sends last."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wschat.protocol import Done

if TYPE_CHECKING:
    from .generation import GenerationRun


@dataclass(frozen=True, slots=True)
class RunStarted:
    run: GenerationRun


@dataclass(frozen=True, slots=True)
class TokensSent:
    run: GenerationRun
    count: int  # tokens in the frame (several when a slow socket merged them)


@dataclass(frozen=True, slots=True)
class RunDone:
    run: GenerationRun
    done: Done


RunEvent = RunStarted | TokensSent | RunDone
RunListener = Callable[[RunEvent], None]

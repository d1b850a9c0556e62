"""What a session needs from an engine, and the thread/loop bridge every engine uses.

An engine turns a ``GenerationRequest`` into a ``Generation``: an async stream of ``TokenPiece``
items that always ends with exactly one ``Finished`` (PROTOCOL.md "Server frames": exactly one
``done`` per ``start``). Work happens off the event loop; items cross to it with
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from wschat.protocol import FinishReason

from .formats import PromptFormat


class CancelFlag:
    """Set by cancel, reset, disconnect and shutdown; read once per decode step by the worker."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Resolved parameters: every value set (the session merged defaults in)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(slots=True)
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams
    # Every image of the conversation in order, for engines that must re-prefill them.
    images: Sequence[Any] = ()
    # The session the request belongs to: engines keep its KV state between turns.
    session_key: str | None = None


@dataclass(frozen=True, slots=True)
class TokenPiece:
    text: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    reason: FinishReason
    completion_ids: tuple[int, ...] = ()
    cached_tokens: int = 0
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str
    model: str
    device: str
    dtype: str
    context_tokens: int
    images: bool
    max_images: int
    # The prompt format's name (engine/formats.py): how conversations are rendered.
    prompt_format: str = ""


Item = TokenPiece | Finished


_COMPACT_EVERY = 256  # waiting text pieces joined into one string this often


@dataclass(eq=False)
class Generation:
    """One running generation as the session sees it: token text in order, then one
    ``Finished``.

    Text that arrives while the reader is busy (a slow socket) waits as one merged piece: a
    joined string and a compact id array, so a stalled client costs about the bytes of its text,
    not an object per token.
    """

    cancel_flag: CancelFlag = field(default_factory=CancelFlag)
    cached_tokens: int = 0
    _texts: list[str] = field(default_factory=list)
    _ids: array[int] = field(default_factory=lambda: array("q"))
    _end: Finished | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _finished: bool = False

    def cancel(self) -> None:
        self.cancel_flag.set()

    def push(self, item: Item) -> None:
        """On the event loop: add an item for the reader."""
        if isinstance(item, Finished):
            self._end = item
        else:
            self._texts.append(item.text)
            self._ids.extend(item.ids)
            if len(self._texts) >= _COMPACT_EVERY:
                self._texts = ["".join(self._texts)]
        self._ready.set()

    def pending(self) -> list[Item]:
        """Every item already waiting, merged, without blocking."""
        items: list[Item] = []
        if self._texts or self._ids:
            items.append(TokenPiece("".join(self._texts), tuple(self._ids)))
            self._texts, self._ids = [], array("q")
        if self._end is not None:
            items.append(self._end)
            self._end = None
        self._ready.clear()
        return items

    async def next_items(self) -> list[Item]:
        """At least one item; all that are waiting."""
        while not (items := self.pending()):
            await self._ready.wait()
        return items

    async def items(self) -> AsyncIterator[Item]:
        while not self._finished:
            for item in await self.next_items():
                if isinstance(item, Finished):
                    self._finished = True
                yield item


class LoopBridge:
    """Hands items from a worker thread to a generation on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, generation: Generation) -> None:
        self._loop = loop
        self._push = generation.push
        self._closed = False

    def put(self, item: Item) -> None:
        if self._closed:
            return
        if isinstance(item, Finished):
            self._closed = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to read
            self._loop.call_soon_threadsafe(self._push, item)


class Engine(Protocol):
    info: EngineInfo
    # How a conversation becomes prompt ids, and which tokens end a reply.
    prompt_format: PromptFormat

    def start(self, request: GenerationRequest) -> Generation:
        """Begin generating; must be called on the event loop."""
        ...

    def tokenize_text(self, text: str) -> list[int]:
        """User text as text: control-token strings in it stay ordinary text."""
        ...

    def token_id(self, token: str) -> int: ...

    def forget(self, session_key: str) -> None:
        """Drop the session's cached KV state (reset, close)."""
        ...

    async def aclose(self) -> None: ...

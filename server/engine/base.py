"""What a session needs from an engine, and the thread/loop bridge every engine uses.

A session talks to an engine in chat turns: ``engine.chat(key)`` gives the session's ``Chat``,
which keeps the conversation in the engine's own form. The session hands it each new ``Turn``
(text, images, params): ``prepare`` counts its tokens for the limit checks, ``start`` gives a
``Generation``: an async stream of ``TokenPiece`` items that always ends with exactly one
``Finished`` carrying the reply's text and usage (PROTOCOL.md "Server frames": exactly one
``done`` per ``start``). ``Generation.cancel`` is the one cancel hook: it sets a ``CancelFlag``
that a worker thread reads once per step and wakes whatever awaits on the loop.

Engines prompted with token ids share ``history.TokenChat`` (the conversation as exact ids per
turn, rendered by a ``PromptFormat``) and hand it ``GenerationRequest``s. Work happens off the
event loop; items cross to it with ``loop.call_soon_threadsafe`` (``LoopBridge``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import weakref
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from wschat.protocol import FinishReason, Usage

from .stopping import completed


class CancelFlag:
    """Set by cancel, reset, disconnect and shutdown; a worker thread reads it once per decode
    step (``is_set``, e.g. in a ``StoppingCriteria``)."""

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


@dataclass(frozen=True, slots=True)
class Turn:
    """A session's new user turn, as it hands it to its ``Chat``."""

    text: str
    params: SamplingParams
    images: Sequence[Any] = ()  # each in the engine's form (``Engine.prepare_image``)


@dataclass(frozen=True, slots=True)
class PreparedTurn:
    """A turn counted and checked against the context: ``Chat.start`` runs it as it is."""

    turn: Turn
    user_tokens: int  # the user's text alone
    prompt_tokens: int  # the whole prompt the model reads (the conversation and this turn)
    rendered: Any = None  # the chat's own form of the turn (``TokenChat``: its token ids)


@dataclass(slots=True)
class GenerationRequest:
    """One generation of an engine prompted with token ids (``history.TokenChat`` makes it)."""

    prompt_ids: list[int]
    params: SamplingParams
    # Every image of the conversation in order, for engines that must re-prefill them.
    images: Sequence[Any] = ()
    # The session the request belongs to: engines keep its KV state between turns.
    session_key: str | None = None
    # How many of ``images`` (the last ones) are new in this turn; the others sit in earlier
    # turns, whose KV state the engine may still hold.
    new_images: int | None = None

    @property
    def fresh_images(self) -> int:
        return len(self.images) if self.new_images is None else self.new_images


@dataclass(frozen=True, slots=True)
class TokenPiece:
    text: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a reply: why, its ids, and (``LoopBridge`` fills them in) its text and usage."""

    reason: FinishReason
    completion_ids: tuple[int, ...] = ()
    error: BaseException | None = None
    text: str = ""
    usage: Usage | None = None


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
    # Generations it decodes in one forward pass, when it batches them (the sessions' slots
    # follow it unless --max-concurrent is set); None when each runs on its own
    batch_width: int | None = None
    # Token ids run from 0 to below this (the model's embedding rows); None when unknown: an id
    # past it fails the forward pass of every row of a batch
    vocab_size: int | None = None
    # The model and tokenizer (``fingerprint``): token ids kept by one engine mean the same to
    # another only when theirs are equal
    fingerprint: str = ""


def fingerprint(*parts: Any) -> str:
    """A short digest of ``parts`` (JSON-able: a model's config, a tokenizer's vocabulary)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# A vocabulary's digest takes about half a second (Gemma 3's 262,144 tokens): once per
# tokenizer, however many engines share it
_VOCABULARIES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def vocabulary_fingerprint(tokenizer: Any, vocab: Callable[[], dict[str, int]]) -> str:
    """``fingerprint`` of a tokenizer's ``vocab()``, kept while the tokenizer lives."""
    digest = _VOCABULARIES.get(tokenizer)
    if digest is None:
        digest = _VOCABULARIES[tokenizer] = fingerprint(sorted(vocab().items()))
    return digest


@dataclass(frozen=True, slots=True)
class KVUsage:
    """The KV state an engine keeps for idle sessions, under one budget for all its paths."""

    tokens: int
    bytes: int
    budget_bytes: int


Item = TokenPiece | Finished


class TextPieces:
    """Text that comes in many small pieces (a token's), kept as a few strings: the pieces are
    joined into one every 256, so a long text costs about its bytes, not an object per piece."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[str] = []

    def append(self, piece: str) -> None:
        self._parts.append(piece)
        if len(self._parts) >= 256:
            self.join()

    def join(self) -> str:
        """All the text so far, kept from now on as that one string."""
        text = "".join(self._parts)
        self._parts = [text]
        return text

    def __bool__(self) -> bool:
        """Whether any piece came (an empty one too)."""
        return bool(self._parts)


@dataclass(eq=False)
class Generation:
    """One running generation as the session sees it: token text in order, then one
    ``Finished``.

    Text that arrives while the reader is busy (a slow socket) waits as one merged piece: a
    joined string and a compact id array, so a stalled client costs about the bytes of its text,
    not an object per token.
    """

    cancel_flag: CancelFlag = field(default_factory=CancelFlag)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # Run on the loop when the ``Finished`` arrives (the chat records the exchange).
    on_finish: list[Callable[[Finished], None]] = field(default_factory=list)
    _texts: TextPieces = field(default_factory=TextPieces)
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
            for callback in self.on_finish:
                callback(item)
        else:
            self._texts.append(item.text)
            self._ids.extend(item.ids)
        self._ready.set()

    def pending(self) -> list[Item]:
        """Every item already waiting, merged, without blocking."""
        items: list[Item] = []
        if self._texts or self._ids:
            items.append(TokenPiece(self._texts.join(), tuple(self._ids)))
            self._texts, self._ids = TextPieces(), array("q")
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
    """Hands items from a worker thread to a generation on the event loop; completes the
    ``Finished`` with the text and the token count that went through it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, generation: Generation) -> None:
        self._loop = loop
        self._generation = generation
        self._texts = TextPieces()
        self._tokens = 0
        self._closed = False

    def put(self, item: Item) -> None:
        if self._closed:
            return
        if isinstance(item, Finished):
            self._closed = True
            g = self._generation
            item = completed(
                item,
                text=self._texts.join(),
                prompt_tokens=g.prompt_tokens,
                completion_tokens=self._tokens,
                cached_tokens=g.cached_tokens,
            )
        else:
            self._texts.append(item.text)
            self._tokens += len(item.ids)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to read
            self._loop.call_soon_threadsafe(self._generation.push, item)


class Chat(Protocol):
    """One session's conversation as its engine keeps it."""

    @property
    def system(self) -> str | None: ...

    @property
    def turns(self) -> int:
        """Finished (or cancelled) exchanges."""
        ...

    @property
    def generated_tokens(self) -> int:
        """The replies' tokens, the ones that ended them left out (the dashboard's count)."""
        ...

    @property
    def images(self) -> list[Any]:
        """Every image it holds: its exchanges' and the running turn's."""
        ...

    async def set_system(self, text: str | None, *, min_turn_tokens: int) -> None:
        """A new system prompt (None or empty: none) starts the conversation afresh; raises
        ``TooLarge`` (and changes nothing) when it leaves no room for a turn of
        ``min_turn_tokens``."""
        ...

    async def prepare(self, turn: Turn, *, max_user_tokens: int) -> PreparedTurn:
        """Count the turn: ``TooLarge`` over ``max_user_tokens`` of text, ``ContextOverflow``
        when the conversation and it do not fit the context. Changes nothing."""
        ...

    def start(self, prepared: PreparedTurn) -> Generation:
        """Begin the reply (on the event loop); the exchange joins the conversation when its
        ``Finished`` comes, unless the generation failed."""
        ...

    def reset(self) -> None:
        """Forget the exchanges (the system prompt stays)."""
        ...

    def close(self) -> None:
        """The session is gone: drop what the engine keeps for it."""
        ...

    def export_state(self) -> dict[str, Any]:
        """The conversation as plain data (str, int, lists, dicts; images in the engine's form)
        from which ``import_state`` rebuilds it exactly, in this process or another one with
        the same engine. A running turn is not part of it."""
        ...

    def import_state(self, state: dict[str, Any]) -> None:
        """Replace the conversation with an exported one; ``ValueError`` when it is not one."""
        ...

    def export_running(self) -> dict[str, Any] | None:
        """The running turn as it was prompted, as plain data (None when none runs): what
        ``add_cancelled`` needs to keep it, should the process generating it die."""
        ...

    def add_cancelled(self, running: dict[str, Any], reply_ids: Sequence[int]) -> None:
        """A turn ``export_running`` gave (maybe in another process) joins the conversation as
        a cancelled exchange whose reply is ``reply_ids``; ``ValueError`` when it is not one."""
        ...


class Engine(Protocol):
    info: EngineInfo

    def chat(self, key: str) -> Chat:
        """A new conversation for the session ``key``."""
        ...

    def prepare_image(self, image: Any) -> Any:
        """A checked upright RGB Pillow image in the form a chat keeps and generates from;
        ``ImagesUnsupported`` when the model reads none."""
        ...

    def kv_usage(self) -> KVUsage | None:
        """The KV state kept between turns, when the engine keeps any."""
        ...

    def worker_threads(self) -> int | None:
        """CPU threads its workers last used, when it runs on this machine's CPU."""
        ...

    async def reachable(self) -> bool:
        """Whether what generates answers now (an engine over HTTP; in process: always)."""
        ...

    async def aclose(self) -> None: ...

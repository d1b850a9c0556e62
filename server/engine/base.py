"""The engine interface (``Engine``), what crosses it, and the thread/loop bridge engines use.

An engine turns a rendered prompt into tokens; everything about the conversation is written once,
above it, in ``history.Chat``: a session's ``Chat`` keeps the conversation as exact token ids per
turn, rendered with the engine's ``PromptFormat``, counts each new ``Turn`` for the limit checks
and hands the engine a ``GenerationRequest``: the prompt as ids, and the same conversation as
``Message``s for an engine that sends messages (a chat API, for images). ``Engine.generate`` gives a
``Generation``: an async stream of ``TokenPiece`` items that always ends with exactly one
``Finished`` (PROTOCOL.md "Server frames": exactly one ``done`` per ``start``).
``Generation.cancel`` is the one cancel hook: it sets a ``CancelFlag`` that a worker thread reads
once per step (an engine streaming on the event loop cancels its task there too). Work in a
thread crosses to the loop with ``loop.call_soon_threadsafe`` (``LoopBridge``).
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

from .formats import PromptFormat
from .grammar import ResponseFormat
from .stopping import completed
from .tokenizing import TextTokenizer
from .tools import ToolUse


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
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # what the reply is held to (grammar.py); None: nothing
    response_format: ResponseFormat | None = None
    # each token's logprob and this many alternatives (``Logprob``); None: none computed
    logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class TokenChoice:
    """A token and its log-probability under the model: its id, its text alone and its bytes
    (a byte-fallback token's byte, which alone is no text)."""

    id: int
    text: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class Logprob:
    """A generated token's log-probability and the most probable tokens in its place, most
    probable first (``SamplingParams.logprobs`` of them), all from the model's distribution
    before the sampling settings and a response format's grammar."""

    chosen: TokenChoice
    top: tuple[TokenChoice, ...] = ()


@dataclass(frozen=True, slots=True)
class Turn:
    """A session's new user turn, as it hands it to its ``Chat``."""

    text: str
    params: SamplingParams
    images: Sequence[Any] = ()  # each in the engine's form (``Engine.prepare_image``)
    tools: ToolUse | None = None  # the tools its reply may call (tools.py)


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation as a chat API takes it: ``role`` ("system", "user" or
    "assistant"), its text as the ids it was prompted with (a reply without the token that ended
    it) and a user turn's images, which every prompt format places before the text."""

    role: str
    ids: Sequence[int]
    images: Sequence[Any] = ()


@dataclass(slots=True)
class GenerationRequest:
    """One generation: the conversation and its new user turn, as ``history.Chat`` renders it."""

    prompt_ids: list[int]
    params: SamplingParams
    # Every image of the conversation in order, for engines that must re-prefill them.
    images: Sequence[Any] = ()
    # The session the request belongs to: engines keep its KV state between turns.
    session_key: str | None = None
    # How many of ``images`` (the last ones) are new in this turn; the others sit in earlier
    # turns, whose KV state the engine may still hold.
    new_images: int | None = None
    # The same prompt as messages (the open reply left out), for an engine that sends messages.
    messages: Sequence[Message] = ()
    # How many leading ``prompt_ids`` are the conversation's opening (``PromptFormat.opening``):
    # the same for every conversation with its format and system prompt, so a local engine
    # shares their KV state across sessions. 0: nothing to share.
    opening: int = 0
    # Who may share that opening's KV state: "" for an opening without a system prompt (the
    # format's own, the same for everyone); with one a client set, its owner's scope, so that
    # a reused opening says nothing about what another client sent. Never shown (repr).
    opening_scope: str = field(default="", repr=False)
    # Who may share the cached state of the whole prompt: the owner's scope, with or without a
    # system prompt, for an engine whose prefix cache every request reads (a remote one holds
    # whole conversations there); "" when no token was offered. Never shown (repr).
    cache_scope: str = field(default="", repr=False)

    @property
    def fresh_images(self) -> int:
        return len(self.images) if self.new_images is None else self.new_images


@dataclass(frozen=True, slots=True)
class TokenPiece:
    text: str
    ids: tuple[int, ...]
    # one per id, in order, when the request asked for them (``SamplingParams.logprobs``)
    logprobs: tuple[Logprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a reply: why, its ids, and (``LoopBridge`` fills them in) its text and usage."""

    reason: FinishReason
    completion_ids: tuple[int, ...] = ()
    error: BaseException | None = None
    text: str = ""
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class RemoteEngine:
    """An engine over HTTP, as /readyz names it: what it is, where, and what it serves."""

    kind: str  # its dialect's name: ``vllm``, ``llama.cpp``, ``sglang``
    host: str  # the host of its base URL (a restarted llama.cpp child keeps it, not its port)
    model: str  # the model as the engine names it (its /v1/models id)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str
    model: str
    # Where it generates: the device in this process (``cpu``, ``cuda:0``), else the host of the
    # engine over HTTP (/v1/stats and /metrics show it as ``device``, /readyz as ``remote``)
    runs_on: str
    # What generates there: the weights' precision in this process (``bf16-packed``), else the
    # engine's kind (``vllm``, ``llama.cpp``) (``dtype`` on the wire)
    backend: str
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
    # The (width, height) ``prepare_image`` resizes every image to, when it does: an upload may
    # be decoded straight down toward it (sessions/images.py); None: kept as uploaded
    image_size: tuple[int, int] | None = None
    # An engine over HTTP (engine/openai): /readyz says this instead of a device and a dtype
    remote: RemoteEngine | None = None
    # What the model can and cannot do, in one line, where it is known (``ready.about``; the
    # runtime sets it for the embedded model: embedded.EMBEDDED_ABOUT)
    about: str = ""


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
    _logprobs: list[Logprob] = field(default_factory=list)
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
            self._logprobs.extend(item.logprobs)
        self._ready.set()

    def pending(self) -> list[Item]:
        """Every item already waiting, without blocking: the pieces merged into one (the only
        place they are), then the ``Finished`` if it came."""
        items: list[Item] = []
        if self._texts or self._ids:
            items.append(TokenPiece(self._texts.join(), tuple(self._ids), tuple(self._logprobs)))
            self._texts, self._ids, self._logprobs = TextPieces(), array("q"), []
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


class Engine(Protocol):
    """What every engine implements: prompts (as ids, or as messages) become tokens. The
    conversation is the session's ``history.Chat``, the same for every engine."""

    info: EngineInfo
    prompt_format: PromptFormat  # how ``Chat`` renders its prompts
    text_tokenizer: TextTokenizer  # one per engine: long texts go to one worker thread

    def image_placeholder_ids(self) -> list[int]:
        """The prompt ids one image occupies; ``ImagesUnsupported`` without a vision tower."""
        ...

    def prepare_image(self, image: Any) -> Any:
        """A checked upright RGB Pillow image in the form a chat keeps and generates from;
        ``ImagesUnsupported`` when the model reads none."""
        ...

    async def prepare_reply(self, params: SamplingParams) -> None:
        """Ready for a reply with ``params``, before it is accepted: a local engine compiles its
        response format's grammar (its vocabulary's view built the first time), or the refusal
        is raised: ``SchemaRefused`` (a schema it cannot enforce), ``FeatureUnsupported`` (a
        response format or logprobs a remote engine takes none of)."""
        ...

    def generate(self, request: GenerationRequest) -> Generation:
        """Begin generating (on the event loop), once ``prepare_reply`` returned for its
        params."""
        ...

    def forget(self, session_key: str) -> None:
        """Drop what is kept for the session (its KV state)."""
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

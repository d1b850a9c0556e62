"""``OpenAIEngine``: replies streamed from an OpenAI-compatible server (vLLM, llama.cpp's server)
behind the engine interface (``engine/base.py``).

The gateway renders every prompt itself, as token ids in the model's prompt format, with a
torch-free tokenizer (``tokenizer``), and sends them to the engine's completions endpoint
(``/v1/completions``; llama.cpp's native ``/completion``): user text stays text, and each turn's
ids extend the last turn's exactly, which is what the engine's prefix cache matches on.
Cancel, reset, disconnect and shutdown close the HTTP stream, which the engine takes as the
request's abort; so does a reply that reaches its token limit, whatever the engine does with the
``max_tokens`` it was sent. What the engine streams is checked as it comes (ids in the
vocabulary, a chunk's text and a line within their byte limits): a bad answer ends the reply as
``EngineFailed``. Where the engine's prefix cache is every client's (no salt: llama.cpp,
SGLang), a reply's cached tokens are at most the prefix its owner sent itself
(``prefixes.OwnPrefixes``): the engine's own count would tell one client what another sent.
This class is the adapter; the HTTP client (``client``), the engines' spellings (``dialect``)
and the error mapping (``errors``) do not depend on the interface; ``startup`` builds one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from wschat.protocol import FinishReason

from ..base import (
    EngineInfo,
    Finished,
    Generation,
    GenerationRequest,
    KVUsage,
    Logprob,
    RemoteEngine,
    SamplingParams,
    TokenChoice,
    TokenPiece,
    fingerprint,
    vocabulary_fingerprint,
)
from ..errors import ImagesUnsupported
from ..formats import GemmaTurns, PromptFormat
from ..prefixes import OwnPrefixes
from ..stopping import StopTexts, completed, final_reason, token_budget
from ..token_bytes import TokenTexts
from ..tokenizing import TextTokenizer
from .burst import Burst
from .client import EngineHttp
from .dialect import CHAT_PATH as CHAT_PATH  # where tests and tools find it
from .dialect import Call, Dialect
from .errors import bad_answer, lost
from .reply_fields import RawLogprob
from .tokenizer import GatewayTokenizer
from .vision import IMAGE_SIZE, ImageTokens, VisionError, chat_messages, normalise

NAME = "openai"
_REACHABLE_TTL_S = 1.0
# A chunk's text: a token's, or a few held back by the engine (a stop string's start).
CHUNK_TEXT_BYTES = 64 * 1024
# A line of a reply's stream: llama.cpp's last chunk repeats the prompt as text, so a line may
# hold the context's text (a token's text is at most a few dozen bytes, escaped).
LINE_BASE_BYTES = 1 << 20
LINE_BYTES_PER_TOKEN = 64


@dataclass
class _Reply:
    """A reply as it streams in: its ids and texts, and why it ends (the engine's word, or
    "length" once it reaches ``limit``, ours to enforce: an engine may ignore it). ``spent``:
    the tokens counted against the limit, the ids and one for a text without ids. Its text goes
    through ``stops`` as on every engine: an engine may stream a stop's start before it stops."""

    limit: int
    prompt_tokens: int
    strip: bool  # the prompt format drops the reply's leading space
    known: int  # the most prompt tokens its owner may be told were cached (``_sent``)
    stops: StopTexts
    top: int | None = None  # the alternatives each token's logprobs list; None: not asked
    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish: str | None = None
    spent: int = 0
    held: list[int] = field(default_factory=list)  # ids whose text ``stops`` holds back
    held_logprobs: list[Logprob] = field(default_factory=list)  # theirs, where asked for

    def reason(self) -> FinishReason:
        if self.finish is None:
            raise lost("the stream ended without a finish reason")
        return final_reason(cancelled=False, stopped=self.finish != "length")

    def push(
        self,
        text: str,
        ids: Sequence[int],
        generation: Generation,
        logprobs: Sequence[Logprob] = (),
    ) -> None:
        """The text that may be shown now, with the ids it came with (and their logprobs); a
        stop ends the reply."""
        self.ids += ids
        self.held += ids
        self.held_logprobs += logprobs
        shown = self.stops.feed(text)
        if shown:
            self._send(shown, generation)
        if self.stops.hit:
            self.finish = "stop"

    def flush(self, generation: Generation) -> None:
        """What was held back, once the reply ends: the text shown, the ids kept."""
        shown = self.stops.flush()
        if shown or self.held:
            self._send(shown, generation)

    def _send(self, text: str, generation: Generation) -> None:
        self.texts.append(text)
        generation.push(TokenPiece(text, tuple(self.held), tuple(self.held_logprobs)))
        self.held_logprobs = []
        self.held = []


def _ended_by(error: BaseException) -> Finished:
    """A reply an error ended: cancelled (the stream is closed by now: leaving ``async with``
    closed the connection), else failed; a failed connection is the engine lost mid-reply."""
    if isinstance(error, asyncio.CancelledError):
        return Finished(FinishReason.CANCELLED)
    if isinstance(error, httpx.HTTPError):
        error = lost(repr(error))
    return Finished(FinishReason.ERROR, error=error)


class HttpGeneration(Generation):
    """A generation whose cancel also stops the task that reads the engine's stream, once: a
    second cancel of the task would land in the stream's close (a client that leaves cancels
    its reply twice, from its stream and from its disconnect)."""

    _task: asyncio.Task[None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
        self._loop, self._task = loop, task

    def cancel(self) -> None:
        if self.cancel_flag.is_set():
            return
        super().cancel()
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)


class Child(Protocol):
    """A process started for the engine, which stops it when it closes (``LlamaCppServer`` in
    ``runtime/supervisor.py``)."""

    def stop(self) -> None: ...


class OpenAIEngine:
    # what closing the engine also stops: --engine llamacpp's server; None for --engine openai
    child: Child | None = None

    def __init__(
        self,
        http: EngineHttp,
        dialect: Dialect,
        model: str,
        tokenizer: GatewayTokenizer,
        prompt_format: PromptFormat,
        context_tokens: int,
        max_images: int = 0,
        name: str = NAME,
    ) -> None:
        self.name = name
        self.http = http
        self.dialect = dialect
        self.model = model
        self.tokenizer = tokenizer
        self._token_texts = TokenTexts(tokenizer.backend)
        self.prompt_format = prompt_format
        self.text_tokenizer = TextTokenizer()
        host = urlsplit(http.api_url).hostname or http.api_url  # a restarted child keeps it
        self.info = EngineInfo(
            name,
            model,
            host,
            dialect.name,
            context_tokens,
            max_images > 0,
            max_images,
            prompt_format=prompt_format.name,
            vocab_size=max(tokenizer.vocab().values(), default=-1) + 1,
            fingerprint=fingerprint(
                model, vocabulary_fingerprint(tokenizer, tokenizer.vocab), prompt_format.name
            ),
            remote=RemoteEngine(dialect.name, host, model),
            image_size=(IMAGE_SIZE, IMAGE_SIZE) if max_images > 0 else None,
        )
        self._vision = vision_tokens(tokenizer, prompt_format) if max_images > 0 else None
        # End tokens stop as ids where the engine reads stop_token_ids, else as its own
        # end-of-generation tokens; turn labels as stop strings, and here (the engine's text
        # goes through StopTexts), so an engine that streams a stop's start shows none of it.
        self._stop_token_ids = sorted(prompt_format.end_ids)
        self._label_stops = ["\n" + label for label in prompt_format.turn_labels]
        self._line_bytes = LINE_BASE_BYTES + LINE_BYTES_PER_TOKEN * context_tokens
        self._tasks: set[asyncio.Task[None]] = set()
        self._burst = Burst()  # prompts sent together reach the engine together
        # what each owner sent, where the engine's prefix cache is every owner's (no salt)
        self._own = None if dialect.salts_cache else OwnPrefixes()
        self._reachable: tuple[float, bool] = (0.0, True)

    # -- the engine interface -------------------------------------------------------------

    def kv_usage(self) -> KVUsage | None:
        return None  # the engine's own cache, which it reports per reply (cached_tokens)

    def worker_threads(self) -> int | None:
        return None

    def image_placeholder_ids(self) -> list[int]:
        """The ids one image stands for in a prompt (its tokens in the engine's context)."""
        return self._require_vision()[0].placeholder()

    def prepare_image(self, image: Any) -> Any:
        """A checked image as the session keeps it: at the vision tower's input size."""
        self._require_vision()
        return normalise(image)

    def _require_vision(self) -> tuple[ImageTokens, list[int]]:
        if self._vision is None:
            raise ImagesUnsupported(f"the model {self.model!r} does not read images")
        return self._vision

    def forget(self, session_key: str) -> None:
        """Nothing to drop: the engine's prefix cache is keyed by the ids, not the session."""

    async def prepare_reply(self, params: SamplingParams) -> None:
        # the engine compiles a format itself, as it is sent
        self.dialect.fields.check(params, self.dialect.name)

    def _logprobs(self, raw: Sequence[RawLogprob], top: int | None, ids: int) -> list[Logprob]:
        """A chunk's logprobs with each token's text, ``top`` alternatives each at most (none
        where the reply asked for none); a bad answer unless one per id, all in the
        vocabulary."""
        if top is None:
            return []
        if len(raw) != ids:
            raise bad_answer(f"{len(raw)} logprobs for {ids} tokens")
        vocab_size = self.info.vocab_size or 0
        if any(not i < vocab_size for _, _, alternatives in raw for i, _ in alternatives):
            raise bad_answer(f"a token id outside the vocabulary of {vocab_size}")
        texts = self._token_texts

        def choice(token_id: int, logprob: float) -> TokenChoice:
            return TokenChoice(token_id, *texts.of(token_id), logprob)

        return [
            Logprob(choice(i, v), tuple(choice(a, w) for a, w in alternatives[:top]))
            for i, v, alternatives in raw
        ]

    def generate(self, request: GenerationRequest) -> Generation:
        loop = asyncio.get_running_loop()
        generation = HttpGeneration(prompt_tokens=len(request.prompt_ids))
        task = loop.create_task(self._run(request, generation), name="wschat-openai-stream")
        generation.bind(loop, task)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return generation

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        await self.http.aclose()
        if self.child is not None:
            await asyncio.to_thread(self.child.stop)

    # -- beyond the interface ---------------------------------------------------------------

    async def reachable(self) -> bool:
        """Whether the engine answers its health check (asked at most once a second)."""
        checked_at, answer = self._reachable
        if time.monotonic() - checked_at >= _REACHABLE_TTL_S:
            answer = await self.http.healthy()
            self._reachable = (time.monotonic(), answer)
        return answer

    def completion_body(self, request: GenerationRequest) -> dict[str, Any]:
        """A text prompt, as token ids, for the dialect's ``text_path``."""
        return self.dialect.text_body(
            self.model,
            request.prompt_ids,
            self._max_tokens(request),
            self._sampling(request),
            request.cache_scope,
        )

    def chat_body(self, request: GenerationRequest) -> dict[str, Any]:
        """A prompt with images, for ``/v1/chat/completions``: the same conversation as
        messages, the images as data URIs, the same sampling fields."""
        system_gap = self._require_vision()[1]
        messages = chat_messages(request.messages, self.tokenizer.decode, system_gap)
        return self.dialect.chat_body(
            self.model,
            messages,
            self._max_tokens(request),
            self._sampling(request),
            request.cache_scope,
        )

    def _max_tokens(self, request: GenerationRequest) -> int:
        # never more than the context holds: vLLM refuses such a request outright
        params, context = request.params, self.info.context_tokens
        return token_budget(params.max_new_tokens, context, len(request.prompt_ids))

    def _sampling(self, request: GenerationRequest) -> dict[str, Any]:
        params = request.params
        stop = [*params.stop, *self._label_stops]
        sampling = self.dialect.sampling(params, stop=stop, stop_token_ids=self._stop_token_ids)
        chat = bool(request.images)  # the chat API: asked for no logprobs (the module says)
        fields = self.dialect.fields
        sampling |= fields.constrained(params.response_format, chat=chat)
        return sampling if chat else sampling | fields.logprob_fields(params.logprobs)

    def _sent(self, request: GenerationRequest, ids: list[int]) -> int:
        """``ids`` go to the engine for the request's owner, who may be told of as many cached
        prompt tokens as this returns: all of them where the engine keeps each owner's prefixes
        apart (a salt) or every client is one owner (no tokens); else what it sent itself
        before, or the opening every conversation without a system prompt shares (PROTOCOL.md
        section 7)."""
        if self._own is None or not request.cache_scope:
            return len(ids)
        everyones = 0 if request.opening_scope else request.opening
        return max(self._own.add(request.cache_scope, ids), everyones)

    def _call(self, request: GenerationRequest) -> Call:
        """Where the request goes and how its reply is read: a prompt with images through the
        chat API, any other as ids."""
        if request.images:
            return self.dialect.chat_call(self.chat_body(request))
        return self.dialect.text_call(self.completion_body(request))

    async def _run(self, request: GenerationRequest, generation: Generation) -> None:
        fmt = self.prompt_format
        reply = _Reply(
            self._max_tokens(request),
            len(request.prompt_ids),
            fmt.strips_leading_space,
            self._sent(request, request.prompt_ids),
            StopTexts(request.params.stop, fmt.turn_labels),
            None if request.images else request.params.logprobs,
        )
        try:
            call = self._call(request)
            await self._burst.join()
            stream = self.http.stream(call.path, call.body, request.session_key, self._line_bytes)
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    if not self._take(call, chunk, reply, generation):
                        break  # the stream closed: what came past the limit is not taken
            finished = Finished(reply.reason())
        except (asyncio.CancelledError, Exception) as error:
            finished = _ended_by(error)
        reply.flush(generation)
        self._sent(request, [*request.prompt_ids, *reply.ids])
        ended = completed(
            dataclasses.replace(finished, completion_ids=tuple(reply.ids)),
            text="".join(reply.texts),
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=len(reply.ids),
            cached_tokens=generation.cached_tokens,
        )
        generation.push(ended)

    def _take(
        self, call: Call, chunk: dict[str, Any], reply: _Reply, generation: Generation
    ) -> bool:
        """One chunk into the reply, its tokens pushed; False once the reply is at its limit."""
        piece = call.read(chunk)
        if piece.cached_tokens is not None:
            # an engine may count an image's tokens otherwise: at most the prompt
            generation.cached_tokens = min(piece.cached_tokens, reply.prompt_tokens, reply.known)
        text, ids = self._checked(piece.text, list(piece.ids))
        if call.ids_from_text and text and not ids:  # an engine that gives chat text alone
            ids = self.tokenizer.tokenize_text(text)
        logprobs = self._logprobs(piece.logprobs, reply.top, len(ids))
        reply.finish = piece.finish or reply.finish
        if not (text or ids):
            return True
        room = reply.limit - reply.spent
        if room <= 0:  # more than it was asked for
            reply.finish = "length"
            return False
        cut = len(ids) > room
        if cut:
            ids, logprobs = ids[:room], logprobs[:room]
            text = self.tokenizer.decode(ids)
            reply.finish = "length"
        reply.spent += max(len(ids), 1)
        if reply.strip and not reply.ids:
            text = text.removeprefix(" ")
        reply.push(text, ids, generation, logprobs)
        return not (cut or reply.stops.hit)

    def _checked(self, text: str, ids: list[int]) -> tuple[str, list[int]]:
        """A chunk's text and ids, or a bad answer: an id outside the vocabulary, a text over
        ``CHUNK_TEXT_BYTES``."""
        vocab_size = self.info.vocab_size or 0
        if any(not 0 <= i < vocab_size for i in ids):
            raise bad_answer(f"a token id outside the vocabulary of {vocab_size}")
        if len(text) > CHUNK_TEXT_BYTES // 4 and len(text.encode()) > CHUNK_TEXT_BYTES:
            raise bad_answer(f"a chunk's text over {CHUNK_TEXT_BYTES} bytes")
        return text, ids


def vision_tokens(tokenizer: GatewayTokenizer, fmt: PromptFormat) -> tuple[ImageTokens, list[int]]:
    """What image turns need: Gemma 3's image tokens, and the ids between a system prompt and
    the first user turn's text (the chat API is given Gemma turns' texts: the context is counted
    in them)."""
    if not isinstance(fmt, GemmaTurns):
        raise VisionError(f"images need the gemma-turns prompt format, not {fmt.name!r}")
    return ImageTokens.of(tokenizer.token_id), tokenizer.tokenize_text("\n\n")

"""Structured output: a response format compiled into a grammar over the model's vocabulary, and
one matcher per reply that says which tokens may come next (llguidance).

    Grammars(build)                          an engine's: its compiler built once, off the event
        |                                    loop, at the first format (or at start)
        .prepare(ResponseFormat)             awaited before a reply is accepted: the format
        |                                    compiled (milliseconds; kept per format, LRU) or
        |                                    SchemaRefused with llguidance's reason
        .matcher(ResponseFormat)             in the engine's worker: one reply's matcher
    GrammarCompiler(tokenizer, vocab_size, stop_ids)
        .compile(ResponseFormat) -> CompiledGrammar
    CompiledGrammar.matcher() -> GrammarMatcher   one per reply (a copy)
        .allowed_mask(into)     the next token's allowed ids, as bits, into an int32 row
        .advance(token_id)      the token the row picked
        .is_complete            the JSON is whole: a stop token may come next
        .is_finished            nothing but a stop token may come next, or one came

A ``ResponseFormat`` is a JSON schema (``json_object``: any object) or, for what a schema cannot
say (a tool call's wrapping), a grammar in llguidance's Lark syntax; either way a row's matcher
is the same and the engines apply it the same way.

Why llguidance (``python -m bench.grammar``, bench/results/grammar.json; the README's Benchmark
says more): on Gemma 3's 262,144 tokens it compiles a schema in 1 to 14 ms where xgrammar takes
16 ms to 5 s and outlines-core 0.6 to 62 s; a token's mask costs all three a fraction of a
percent of a decode step (xgrammar's 30 µs less: 0.02 %); it refuses what it cannot enforce,
with a reason (a look-ahead, ``uniqueItems``, ``not``: xgrammar compiles them and ignores the
keyword); it reads Gemma's special tokens from the tokenizer, so none is allowed before the JSON
is complete; and it is one 3 MB wheel without dependencies (MIT).

JSON is written as Python's ``json.dumps`` writes it (``", "`` and ``": "``, no other
whitespace): a grammar that allows any whitespace between values lets a small model fill its
whole budget with line breaks, and the reply never parses.

The mask is an int32 bitmask row (bit ``i % 32`` of word ``i // 32`` allows token ``i``), written
through the buffer's address, so this module needs no torch; ``local/grammar_mask.py`` allocates
the batch's bitmask and applies it to the logits. A strict ``json_schema`` must be enforced
whole: a keyword llguidance does not implement is refused. Without ``strict`` such a keyword is
left out and the rest enforced.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from wschat.protocol.response_format import JSON_SCHEMA, OutputFormat

from .errors import SchemaRefused
from .grammar_close import Closers, reserve_for
from .grammar_vocab import llg_tokenizer

if TYPE_CHECKING:
    import llguidance
    import llguidance._lib

# Compiled grammars kept per compiler: a schema sent again (a client's fixed tools or format)
# compiles once; the least recently used goes first.
CACHED_GRAMMARS = 64
_WORD_BYTES = 4
_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}
# llguidance's JSON options: JSON as json.dumps writes it (the module docstring)
JSON_OPTIONS: Mapping[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class MaskBuffer(Protocol):
    """A contiguous int32 buffer on the CPU: a torch tensor's row does."""

    def data_ptr(self) -> int: ...

    def numel(self) -> int: ...

    def element_size(self) -> int: ...

    def is_contiguous(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """What a reply is held to: OpenAI's ``response_format`` past ``text``, ``json_object``
    (``schema`` None: any JSON object) or ``json_schema`` with its schema and ``strict``; or
    ``lark``, a grammar in llguidance's Lark syntax (no schema then)."""

    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    strict: bool = False
    lark: str | None = None
    key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # what the compiled grammar is cached under: the same schema however its keys are ordered
        text = json.dumps(self.schema, sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "key", f"{int(self.strict)}{text}{self.lark or ''}")

    @classmethod
    def of(cls, output: OutputFormat | None) -> ResponseFormat | None:
        """A prompt's ``params.response_format`` as the engine holds a reply to it; None for
        ``text`` (no constraint)."""
        if output is None or not output.constrained:
            return None
        if output.type != JSON_SCHEMA:
            return cls()
        return cls(output.schema, output.strict)


class GrammarMatcher:
    """One reply's place in its grammar. Not thread-safe: one worker drives it. With
    ``closers``, its last tokens of ``budget`` are spent closing its JSON (grammar_close.py)."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        words: int,
        closers: Closers | None = None,
        budget: int | None = None,
    ) -> None:
        self._matcher = matcher
        self._bytes = words * _WORD_BYTES
        self._closers = closers if budget is not None else None
        # the tokens taken before the mask narrows to closing ones
        self._open_for = 0 if budget is None else budget - reserve_for(budget)

    def allowed_mask(self, into: MaskBuffer) -> None:
        """The tokens allowed next, as bits, into ``into`` (int32, ``ceil(vocab / 32)`` words,
        contiguous): after a complete JSON, the stop tokens (and whitespace) alone."""
        if into.element_size() != _WORD_BYTES or not into.is_contiguous():
            raise ValueError("the mask must be a contiguous int32 buffer")
        if into.numel() * _WORD_BYTES != self._bytes:
            raise ValueError(f"the mask must hold {self._bytes // _WORD_BYTES} words")
        self._matcher.unsafe_compute_mask_ptr(into.data_ptr(), self._bytes)
        if self._closers is not None and self._open_for <= 0:
            self._closers.narrow(into.data_ptr())

    def advance(self, token_id: int) -> None:
        """Take the token the row picked; ValueError if the grammar does not allow it (the mask
        was not applied), and the matcher allows nothing more."""
        if not self._matcher.consume_token(token_id):
            raise ValueError(f"token {token_id} breaks the grammar: {self._matcher.get_error()}")
        self._open_for -= 1

    @property
    def is_complete(self) -> bool:
        return self._matcher.is_accepting()

    @property
    def is_finished(self) -> bool:
        return self._matcher.is_stopped()


class CompiledGrammar:
    """A response format compiled for one vocabulary; shared by every reply that uses it."""

    def __init__(self, template: llguidance.LLMatcher, words: int, closers: Closers | None) -> None:
        self._template = template  # never advanced: each reply's matcher is a copy
        self._words = words
        self._closers = closers  # None: a grammar that allows text is not closed

    def matcher(self, budget: int | None = None) -> GrammarMatcher:
        """A reply's matcher; with its ``budget`` of tokens, a JSON grammar's closes in time."""
        return GrammarMatcher(self._template.deep_copy(), self._words, self._closers, budget)


class GrammarCompiler:
    """Compiles response formats for one tokenizer; thread-safe (any worker may compile)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_ids: Sequence[int],
        *,
        cached: int = CACHED_GRAMMARS,
    ) -> None:
        """``tokenizer``: the model's ``tokenizers.Tokenizer``; ``vocab_size``: the logits'
        width; ``stop_ids``: the tokens that end a reply, allowed once the JSON is complete and
        not before. Seconds of work, much of it holding the GIL (grammar_vocab.py)."""
        self._tokenizer = llg_tokenizer(tokenizer, vocab_size, stop_ids)
        self.words = (vocab_size + 31) // 32
        self._closers = Closers(self._tokenizer, vocab_size, self.words)
        self._cached = cached
        self._grammars: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # guards _grammars

    def compile(self, response_format: ResponseFormat) -> CompiledGrammar:
        """The format's grammar, from the cache or compiled; SchemaRefused with llguidance's
        reason for one it cannot compile."""
        key = response_format.key
        with self._lock:
            found = self._grammars.get(key)
            if found is not None:
                self._grammars.move_to_end(key)
                return found
        compiled = self._compile(response_format)
        with self._lock:
            self._grammars[key] = compiled
            while len(self._grammars) > self._cached:
                self._grammars.popitem(last=False)
        return compiled

    def _compile(self, response_format: ResponseFormat) -> CompiledGrammar:
        from llguidance import LLMatcher

        if response_format.lark is not None:
            grammar = LLMatcher.grammar_from_lark(response_format.lark)
        else:
            schema = response_format.schema
            try:
                grammar = LLMatcher.grammar_from_json_schema(
                    dict(_ANY_OBJECT if schema is None else schema),
                    # JSON as json.dumps writes it (the module docstring)
                    defaults=cast(
                        "llguidance._lib.JsonCompileOptions",
                        {**JSON_OPTIONS, "lenient": not response_format.strict},
                    ),
                )
            except ValueError as error:  # not a JSON object at all
                raise SchemaRefused.because(str(error)) from error
        template = LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise SchemaRefused.because(template.get_error())
        closers = self._closers if response_format.lark is None else None
        return CompiledGrammar(template, self.words, closers)


class Grammars:
    """An engine's structured output: its ``GrammarCompiler``, built by ``build`` once, in a
    worker thread, when the first format is prepared, and every format compiled before its reply
    is accepted, so the engine's worker only takes a matcher (``matcher``)."""

    def __init__(self, build: Callable[[], GrammarCompiler]) -> None:
        self._build = build
        self._compiler: GrammarCompiler | None = None
        # the build under way (on the loop that asked first); every later format awaits it
        self._building: asyncio.Future[GrammarCompiler] | None = None

    @property
    def built(self) -> bool:
        return self._compiler is not None

    async def prepare(self, response_format: ResponseFormat) -> None:
        """The format compiled and kept for the replies held to it; SchemaRefused where it
        cannot be."""
        compiler = await self._ready()
        await asyncio.to_thread(compiler.compile, response_format)

    async def _ready(self) -> GrammarCompiler:
        if self._compiler is not None:
            return self._compiler
        if self._building is None:
            self._building = asyncio.ensure_future(asyncio.to_thread(self._build))
        building = self._building
        try:
            self._compiler = await asyncio.shield(building)
        except Exception:
            if self._building is building:  # a failed build: the next format tries again
                self._building = None
            raise
        return self._compiler

    def matcher(self, response_format: ResponseFormat, budget: int | None = None) -> GrammarMatcher:
        """A reply's matcher (in the engine's worker): the prepared format's grammar from the
        cache (compiled again if it was dropped since: milliseconds); ``budget``, the reply's
        tokens at most, its JSON closed within it."""
        if self._compiler is None:
            raise RuntimeError("a response format was not prepared before its reply")
        return self._compiler.compile(response_format).matcher(budget)

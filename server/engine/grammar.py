"""Structured output: a response format compiled into a grammar over the model's vocabulary, and
one matcher per reply that says which tokens may come next (llguidance).

    GrammarCompiler(tokenizer_json, vocab_size, stop_ids)   once per engine: llguidance reads
        |                                                   the vocabulary (13 to 27 s on 2 busy
        |                                                   cores: never on the event loop)
        .compile(ResponseFormat) -> CompiledGrammar         milliseconds; kept per schema (LRU)
        |                                                   or SchemaRefused with the reason
    CompiledGrammar.matcher() -> GrammarMatcher             one per reply (a copy)
        .allowed_mask(into)     the next token's allowed ids, as bits, into an int32 row
        .advance(token_id)      the token the row picked
        .is_complete            the JSON is whole: a stop token may come next
        .is_finished            nothing but a stop token may come next, or one came

Why llguidance (``python -m bench.grammar``, bench/results/grammar.json; the README's Benchmark
says more): on Gemma 3's 262,144 tokens it compiles a schema in 1 to 14 ms where xgrammar takes
16 ms to 5 s and outlines-core 0.6 to 62 s; a token's mask costs all three a fraction of a
percent of a decode step (xgrammar's 30 µs less: 0.02 %); it refuses what it cannot enforce,
with a reason (a look-ahead, ``uniqueItems``, ``not``: xgrammar compiles them and ignores the
keyword); it reads Gemma's special tokens from the tokenizer, so none is allowed before the JSON
is complete; and it is one 3 MB wheel without dependencies (MIT).

The mask is an int32 bitmask row (bit ``i % 32`` of word ``i // 32`` allows token ``i``), written
through the buffer's address, so this module needs no torch; ``local/grammar_mask.py`` allocates
the batch's bitmask and applies it to the logits. A strict ``json_schema`` must be enforced
whole: a keyword llguidance does not implement is refused. Without ``strict`` such a keyword is
left out and the rest enforced.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .errors import SchemaRefused

if TYPE_CHECKING:
    import llguidance

# Compiled grammars kept per compiler: a schema sent again (a client's fixed tools or format)
# compiles once; the least recently used goes first.
CACHED_GRAMMARS = 64
_WORD_BYTES = 4
_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


class MaskBuffer(Protocol):
    """A contiguous int32 buffer on the CPU: a torch tensor's row does."""

    def data_ptr(self) -> int: ...

    def numel(self) -> int: ...

    def element_size(self) -> int: ...

    def is_contiguous(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """OpenAI's ``response_format`` past ``text``: ``json_object`` (``schema`` None: any JSON
    object) or ``json_schema`` with its schema and ``strict``."""

    schema: Mapping[str, Any] | None = None
    strict: bool = False
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # what the compiled grammar is cached under: the same schema however its keys are ordered
        text = json.dumps(self.schema, sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "key", f"{int(self.strict)}{text}")


class GrammarMatcher:
    """One reply's place in its grammar. Not thread-safe: one worker drives it."""

    def __init__(self, matcher: llguidance.LLMatcher, words: int) -> None:
        self._matcher = matcher
        self._bytes = words * _WORD_BYTES

    def allowed_mask(self, into: MaskBuffer) -> None:
        """The tokens allowed next, as bits, into ``into`` (int32, ``ceil(vocab / 32)`` words,
        contiguous): after a complete JSON, the stop tokens (and whitespace) alone."""
        if into.element_size() != _WORD_BYTES or not into.is_contiguous():
            raise ValueError("the mask must be a contiguous int32 buffer")
        if into.numel() * _WORD_BYTES != self._bytes:
            raise ValueError(f"the mask must hold {self._bytes // _WORD_BYTES} words")
        self._matcher.unsafe_compute_mask_ptr(into.data_ptr(), self._bytes)

    def advance(self, token_id: int) -> None:
        """Take the token the row picked; ValueError if the grammar does not allow it (the mask
        was not applied), and the matcher allows nothing more."""
        if not self._matcher.consume_token(token_id):
            raise ValueError(f"token {token_id} breaks the grammar: {self._matcher.get_error()}")

    @property
    def is_complete(self) -> bool:
        return self._matcher.is_accepting()

    @property
    def is_finished(self) -> bool:
        return self._matcher.is_stopped()


class CompiledGrammar:
    """A response format compiled for one vocabulary; shared by every reply that uses it."""

    def __init__(self, template: llguidance.LLMatcher, words: int) -> None:
        self._template = template  # never advanced: each reply's matcher is a copy
        self._words = words

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy(), self._words)


class GrammarCompiler:
    """Compiles response formats for one tokenizer; thread-safe (any worker may compile)."""

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        stop_ids: Sequence[int],
        *,
        cached: int = CACHED_GRAMMARS,
    ) -> None:
        """``tokenizer_json``: the model's ``tokenizer.json`` text (``tokenizer_json_of``);
        ``vocab_size``: the logits' width; ``stop_ids``: the tokens that end a reply, allowed
        once the JSON is complete and not before."""
        import llguidance

        self._tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=list(stop_ids)
        )
        self.words = (vocab_size + 31) // 32
        self._cached = cached
        self._grammars: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # guards _grammars

    def compile(self, response_format: ResponseFormat) -> CompiledGrammar:
        """The format's grammar, from the cache or compiled; SchemaRefused with llguidance's
        reason for a schema it cannot compile."""
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

        schema = dict(_ANY_OBJECT if response_format.schema is None else response_format.schema)
        try:
            grammar = LLMatcher.grammar_from_json_schema(
                schema, defaults={"lenient": not response_format.strict}
            )
        except ValueError as error:  # not a JSON object at all
            raise SchemaRefused.because(str(error)) from error
        template = LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise SchemaRefused.because(template.get_error())
        return CompiledGrammar(template, self.words)


def tokenizer_json_of(tokenizer: Any) -> str:
    """A ``tokenizers.Tokenizer``'s JSON (a transformers tokenizer's ``backend_tokenizer``, the
    gateway's own) without padding or truncation, which would change what a text encodes to."""
    copy = type(tokenizer).from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return str(copy.to_str())

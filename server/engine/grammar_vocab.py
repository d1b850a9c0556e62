"""llguidance's view of a model's vocabulary (``llguidance.LLTokenizer``): each token's bytes,
which tokens are special, and the slices its masks are computed by.

llguidance builds it from a ``tokenizer.json`` itself, but holds the GIL while it does (and so
does reading the tokenizer's JSON): 5 to 9 s for Gemma 3's 262,144 tokens on 2 busy cores, in
which a server's event loop would stand still even with the build in a worker thread. For a
SentencePiece vocabulary (``▁`` for a space, ``<0xNN>`` for a byte: Gemma's, Llama 2's) the
bytes are read here instead, a token at a time in Python, which lets the loop run between
tokens, and llguidance only builds its trie from them (1.7 to 2.7 s with the slices, still
under the GIL: ``grammar.Grammars`` builds it once). Any other tokenizer goes by llguidance's
own route. Both routes give the same bytes and the same special tokens
(tests/engine/test_grammar.py compares them on Gemma's).

It is built once per tokenizer (and vocabulary size and stop tokens) in a process, however many
engines share the tokenizer (an engine and its image path, a bench's several).

The slices are llguidance's JSON ones: its masks inside a JSON string are computed by them
(p99 under 1 ms a token here, where without slices it is 13 ms).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .token_bytes import is_sentencepiece, piece_bytes

if TYPE_CHECKING:
    import llguidance

_SPECIAL_MARK = b"\xff"  # how llguidance tells a special token's bytes from text
# each tokenizer's, by (vocabulary size, stop ids), while the tokenizer lives; the lock makes a
# second engine wait for the first one's build rather than build it again
_BUILT: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], Any]] = (
    weakref.WeakKeyDictionary()
)
_BUILDING = threading.Lock()


def llg_tokenizer(
    tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """The vocabulary of ``tokenizer`` (a ``tokenizers.Tokenizer``: a transformers tokenizer's
    ``backend_tokenizer``, the gateway's own) as llguidance reads it, ``stop_ids`` its end."""
    key = (vocab_size, tuple(stop_ids))
    with _BUILDING:
        built = _BUILT.setdefault(tokenizer, {})
        found: llguidance.LLTokenizer | None = built.get(key)
        if found is None:
            found = built[key] = _built(tokenizer, vocab_size, stop_ids)
        return found


def _built(tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> llguidance.LLTokenizer:
    import llguidance

    slices = llguidance.LLTokenizer.json_slices()
    wrapper = _sentencepiece(tokenizer, vocab_size, stop_ids)
    if wrapper is None:
        return llguidance.LLTokenizer(
            tokenizer_json_of(tokenizer),
            n_vocab=vocab_size,
            eos_token=list(stop_ids),
            slices=slices,
        )
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(wrapper),
        n_vocab=vocab_size,
        eos_token=list(stop_ids),
        slices=slices,
    )


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads of a tokenizer: its tokens' bytes, the special
    ones, and a way to tokenize text."""

    def __init__(self, tokenizer: Any, tokens: list[bytes], special: list[int], eos: int) -> None:
        self._tokenizer = tokenizer
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id: int | None = None

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        encoded = self._tokenizer.encode(text, add_special_tokens=False)
        return list(encoded.ids)


def tokenizer_json_of(tokenizer: Any) -> str:
    """A ``tokenizers.Tokenizer``'s JSON without padding or truncation, which would change what
    a text encodes to."""
    copy = type(tokenizer).from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return str(copy.to_str())


def _sentencepiece(tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> _Vocabulary | None:
    """The vocabulary read here, or None where it is not SentencePiece's with byte fallback."""
    if not is_sentencepiece(tokenizer):
        return None
    added = tokenizer.get_added_tokens_decoder()
    # llguidance's rule: an added token is special when it says so or looks like markup
    special = sorted(
        i
        for i, token in added.items()
        if i < vocab_size
        and (token.special or (token.content.startswith("<") and token.content.endswith(">")))
    )
    special_set = set(special)
    tokens: list[bytes] = []
    for i in range(vocab_size):
        piece = tokenizer.id_to_token(i)
        if piece is None:
            tokens.append(b"")
        elif i in special_set:
            tokens.append(_SPECIAL_MARK + piece.encode())
        else:
            tokens.append(piece_bytes(piece, i in added))
    return _Vocabulary(tokenizer, tokens, special, stop_ids[0] if stop_ids else 0)

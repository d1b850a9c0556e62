"""Each token's own bytes and text, read from a ``tokenizers.Tokenizer``: what llguidance's
vocabulary is built from (grammar_vocab.py) and what a logprob shows of a token (``TokenTexts``).

A SentencePiece vocabulary with byte fallback (Gemma's, Llama 2's: ``▁`` for a space, ``<0xNN>``
for a byte) is read piece by piece, in Python; for any other, a token's text is what the
tokenizer decodes it to alone, and its bytes that text's.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

SPACE = "\u2581"  # SentencePiece's space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# the decoder of a SentencePiece vocabulary with byte fallback, as tokenizers writes it
_SENTENCEPIECE_DECODERS = ({"Replace", "ByteFallback", "Fuse"}, {"Replace", "ByteFallback"})


def is_sentencepiece(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s decoder is SentencePiece's with byte fallback."""
    decoder = json.loads(tokenizer.decoder.__getstate__()) if tokenizer.decoder else {}
    steps = decoder.get("decoders") or []
    kinds = {step.get("type") for step in steps}
    replaces = [s for s in steps if s.get("type") == "Replace"]
    space = all(s.get("pattern") == {"String": SPACE} and s.get("content") == " " for s in replaces)
    return decoder.get("type") == "Sequence" and kinds in _SENTENCEPIECE_DECODERS and space


def piece_bytes(piece: str, added: bool) -> bytes:
    """A SentencePiece piece's bytes: a byte piece's byte (not an added token spelled so), else
    its text with ``▁`` a space."""
    byte = None if added else _BYTE_PIECE.fullmatch(piece)
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    return piece.replace(SPACE, " ").encode()


class TokenTexts:
    """Each token's text alone and its bytes, as a logprob shows them; each id read from the
    tokenizer once and kept (at most the vocabulary: a few MB). Thread-safe."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._sentencepiece = is_sentencepiece(tokenizer)
        self._added = set(tokenizer.get_added_tokens_decoder())
        self._known: dict[int, tuple[str, bytes]] = {}
        self._lock = threading.Lock()  # guards _known's growth (readers see whole entries)

    def of(self, token_id: int) -> tuple[str, bytes]:
        """The token's text alone and its bytes."""
        known = self._known.get(token_id)
        if known is None:
            known = self._read(token_id)
            with self._lock:
                self._known[token_id] = known
        return known

    def _read(self, token_id: int) -> tuple[str, bytes]:
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return "", b""
        if self._sentencepiece:
            data = piece_bytes(piece, token_id in self._added)
            return data.decode("utf-8", errors="replace"), data
        text = str(self._tokenizer.decode([token_id], skip_special_tokens=False))
        return text, text.encode()

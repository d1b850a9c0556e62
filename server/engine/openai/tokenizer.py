"""A torch-free tokenizer for the gateway: a ``tokenizers`` tokenizer as a ``TextCodec``.

``--tokenizer PATH`` reads a ``tokenizer.json`` (or the folder holding one); ``embedded`` builds
one from the embedded Gemma 3 270M GGUF's vocabulary and scores (SentencePiece BPE: a merge's
rank is the score of the piece it makes), and a ``.gguf`` file names another Gemma GGUF to build
it from; each is cached beside the cache's other files, so the gateway renders prompts with the
same ids llama.cpp's server would, with neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..embedded import EMBEDDED, embedded_gguf

log = logging.getLogger("wschat.engine.openai")

_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types that are added tokens
_CACHED_NAME = "gemma-3-270m-tokenizer.json"


class TokenizerError(Exception):
    """A tokenizer that cannot be read, or that does not match the engine's."""


class GatewayTokenizer:
    """``TextCodec`` over a ``tokenizers.Tokenizer``: text as text, markup with its controls."""

    def __init__(self, tokenizer: Tokenizer, name: str) -> None:
        self._tokenizer = tokenizer
        self.name = name
        # Text as text: without these, "<end_of_turn>" typed by a user would become the control.
        self._text = Tokenizer.from_str(tokenizer.to_str())
        self._text.encode_special_tokens = True

    @property
    def backend(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` itself (what a logprob shows of a token is read from)."""
        return self._tokenizer

    def tokenize_text(self, text: str) -> list[int]:
        return list(self._text.encode(text, add_special_tokens=False).ids)

    def tokenize_markup(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_id(self, token: str) -> int:
        found = self._tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(f"no token {token!r} in the vocabulary")
        return int(found)

    def vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab(with_added_tokens=True))

    def newline_ids(self) -> frozenset[int]:
        """Every token whose text holds a line break."""
        return frozenset(i for t, i in self.vocab().items() if "\n" in t or t == "<0x0A>")


def load_tokenizer(spec: str, cache_dir: Path) -> GatewayTokenizer:
    """``spec``: ``embedded``, a ``tokenizer.json`` file or a folder that holds one."""
    if spec == EMBEDDED:
        return GatewayTokenizer(Tokenizer.from_file(str(embedded_tokenizer(cache_dir))), spec)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        try:
            path = gguf_tokenizer(path, cache_dir)
        except (KeyError, ValueError) as error:  # not a GGUF, or not a Gemma vocabulary
            raise TokenizerError(f"no tokenizer can be built from {path}: {error!r}") from error
    elif path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"no tokenizer.json at {path}")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:
        raise TokenizerError(f"{path} is not a tokenizers file: {error}") from error
    return GatewayTokenizer(tokenizer, str(path))


def embedded_tokenizer(cache_dir: Path) -> Path:
    """The embedded model's ``tokenizer.json``, built from its GGUF on first use."""
    target = cache_dir / _CACHED_NAME
    if target.is_file():
        return target
    return _built(embedded_gguf(cache_dir), target)


def gguf_tokenizer(gguf: Path, cache_dir: Path) -> Path:
    """The ``tokenizer.json`` of a Gemma GGUF file, built on first use; a file changed since
    (another size or time) is another file."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    target = cache_dir / "tokenizers" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    return target if target.is_file() else _built(gguf, target)


def _built(gguf: Path, target: Path) -> Path:
    log.info("building the tokenizer of %s", gguf)
    spec = tokenizer_json_from_gguf(gguf)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(spec, ensure_ascii=False))
    partial.replace(target)  # atomic: a concurrent start never reads half a file
    return target


def gguf_path(cache_dir: Path) -> Path:
    """The embedded GGUF, assembled from its package's parts once (what llama.cpp loads)."""
    return embedded_gguf(cache_dir)


def tokenizer_json_from_gguf(path: Path) -> dict[str, Any]:
    """A ``tokenizers`` BPE spec equivalent to a Gemma GGUF's SentencePiece BPE vocabulary."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def array(key: str) -> list[Any]:
        field = reader.fields[key]
        return [field.contents(i) for i in range(len(field.data))]

    tokens: list[str] = array("tokenizer.ggml.tokens")
    scores: list[float] = array("tokenizer.ggml.scores")
    types: list[int] = array("tokenizer.ggml.token_type")
    unk = int(reader.fields["tokenizer.ggml.unknown_token_id"].contents())
    bos = int(reader.fields["tokenizer.ggml.bos_token_id"].contents())
    vocab = {token: i for i, token in enumerate(tokens)}
    added = [i for i, kind in enumerate(types) if kind in (_CONTROL, _USER_DEFINED)]
    skip = {tokens[i] for i in added}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tokens[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": types[i] == _CONTROL,
            }
            for i in added
        ],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": tokens[bos], "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": tokens[bos], "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {
                tokens[bos]: {"id": tokens[bos], "ids": [bos], "tokens": [tokens[bos]]}
            },
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[unk],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": _merges(tokens, scores, vocab, skip),
        },
    }


def _merges(
    tokens: list[str], scores: list[float], vocab: dict[str, int], skip: set[str]
) -> list[list[str]]:
    """Every split of every piece into two pieces, ranked by the whole piece's score (higher
    first): SentencePiece BPE merges the pair whose result scores highest."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score in zip(tokens, scores, strict=True):
        if piece in skip:
            continue
        local = []
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab and left not in skip and right not in skip:
                local.append((vocab[left], vocab[right], left, right))
        local.sort()
        ranked += [(-score, len(left), len(right), left, right) for _, _, left, right in local]
    ranked.sort(key=lambda m: (m[0], m[1], m[2]))
    return [[left, right] for _, _, _, left, right in ranked]

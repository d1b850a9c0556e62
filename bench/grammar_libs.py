"""The grammar libraries ``python -m bench.grammar`` compares, behind one small interface.

Each turns the model's tokenizer into its own vocabulary once (``setup``), compiles a JSON
schema for it (``compile``, raising ``Refused`` with the library's own words), and gives each
row a matcher that writes the allowed tokens of its next step into row ``row`` of an int32
bitmask (bit ``i % 32`` of word ``i // 32`` for token ``i``: the format all three share) and
takes the token picked; the engine's ``grammar_mask.apply_bitmask`` applies it to the logits
for all three.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from typing import Any

import torch

ANY_OBJECT: dict[str, Any] = {"type": "object"}  # response_format json_object


def special_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's special tokens: its named ones and every added token marked special."""
    named = set(tokenizer.all_special_ids)
    return named | {i for i, added in tokenizer.added_tokens_decoder.items() if added.special}


class Refused(Exception):
    """The library cannot compile the schema; the message is its own."""


class Library:
    name = ""
    package = ""  # its distribution on PyPI
    module = ""

    def __init__(self) -> None:
        self.notes: dict[str, Any] = {}  # what setting it up had to know, for the results

    @classmethod
    def installed(cls) -> bool:
        return importlib.util.find_spec(cls.module) is not None

    def setup(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        raise NotImplementedError

    def compile(self, schema: dict[str, Any], strict: bool) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def advance(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def accepting(self, matcher: Any) -> bool:
        """The JSON is complete: a stop token may come next."""
        raise NotImplementedError

    def about(self) -> dict[str, str]:
        meta = importlib.metadata.metadata(self.package)
        fields = ("License-Expression", "License")
        licences = [v for f in fields for v in meta.get_all(f) or () if v]
        licence = licences[0] if licences else ""
        return {"version": meta["Version"], "licence": licence, **self.notes}


class LLGuidance(Library):
    name = "llguidance"
    package = "llguidance"
    module = "llguidance"

    def setup(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        import llguidance.hf

        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, vocab_size, stop_ids)

    def compile(self, schema: dict[str, Any], strict: bool) -> Any:
        from llguidance import LLMatcher

        grammar = LLMatcher.grammar_from_json_schema(schema, defaults={"lenient": not strict})
        template = LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise Refused(template.get_error())
        return template

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        words = bitmask[row]
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_accepting())


class XGrammar(Library):
    name = "xgrammar"
    package = "xgrammar"
    module = "xgrammar"

    def setup(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        import xgrammar

        detected = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids
        )
        # from_huggingface finds none of Gemma's 6,249 special tokens and lets a string hold
        # them (as their spelling); a token spelled "" is special to xgrammar, never allowed
        special = special_ids(tokenizer) - set(stop_ids)
        self.notes["special_tokens"] = (
            f"from_huggingface finds {len(detected.special_token_ids)}; "
            f"{len(special)} spelled empty here"
        )
        spelled = [""] * vocab_size
        for token, token_id in tokenizer.get_vocab().items():
            if token_id < vocab_size and token_id not in special:
                spelled[token_id] = token
        info = xgrammar.TokenizerInfo(
            spelled,
            detected.vocab_type,
            vocab_size=vocab_size,
            stop_token_ids=stop_ids,
            add_prefix_space=detected.add_prefix_space,
        )
        # no cache: every compile the bench times is a real one
        self.compiler = xgrammar.GrammarCompiler(
            info, max_threads=os.cpu_count() or 1, cache_enabled=False
        )

    def compile(self, schema: dict[str, Any], strict: bool) -> Any:
        try:
            return self.compiler.compile_json_schema(schema, strict_mode=strict)
        except RuntimeError as error:
            raise Refused(str(error).strip()) from error

    def matcher(self, compiled: Any) -> Any:
        import xgrammar

        return xgrammar.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_completed())


class OutlinesCore(Library):
    """A regex from the schema, then an index of every token's transitions from every state of
    its automaton: the whole cost is paid at compile time."""

    name = "outlines-core"
    package = "outlines-core"
    module = "outlines_core"

    def setup(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        from outlines_core import Vocabulary

        # Its vocabulary is text: each token as the bytes it stands for (SentencePiece's "▁" a
        # space, "<0xNN>" its byte), without the special tokens, which would otherwise match
        # their own spelling inside a string. It takes one end token only.
        special = special_ids(tokenizer)
        pieces: dict[bytes, list[int]] = {}
        for token, token_id in tokenizer.get_vocab().items():
            if token_id in special or token_id >= vocab_size:
                continue
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                piece = bytes([int(token[3:5], 16)])
            else:
                piece = token.replace("\u2581", " ").encode()
            pieces.setdefault(piece, []).append(token_id)
        self.vocabulary = Vocabulary(stop_ids[0], pieces)
        self.notes["stop_tokens"] = f"one end token: {stop_ids[0]} of {stop_ids}"

    def compile(self, schema: dict[str, Any], strict: bool) -> Any:
        from outlines_core import Index, json_schema

        try:
            regex = json_schema.build_regex_from_schema(json.dumps(schema))
            return Index(regex, self.vocabulary)
        except (ValueError, TypeError) as error:
            raise Refused(str(error).strip()) from error

    def matcher(self, compiled: Any) -> Any:
        from outlines_core import Guide

        return Guide(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        words = bitmask[row]
        matcher.write_mask_into(words.data_ptr(), words.numel(), 4)

    def advance(self, matcher: Any, token: int) -> bool:
        if not matcher.accepts_tokens([token]):
            return False
        matcher.advance(token, return_tokens=False)
        return True

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_finished())


LIBRARIES: dict[str, type[Library]] = {
    lib.name: lib for lib in (LLGuidance, XGrammar, OutlinesCore)
}

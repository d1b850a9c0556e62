"""A JSON reply's last tokens spent closing it, so a reply held to a schema parses even where a
model would fill its whole budget (a number's digits without end, an array's items repeated).

Once a reply has ``reserve_for(budget)`` tokens left, each step's allowed tokens are narrowed to
the ones that close what is open, where the grammar allows any, in this order: those made of
``"``, ``]`` and ``}`` alone that hold a ``"`` (inside a string only a quote closes: a bracket
there is text), those made of ``]`` and ``}`` alone, then those made of ``,``, ``"``, ``]``,
``}`` and spaces that hold a ``,`` (a value ends, the next required key follows); where it allows
none of them (a value must begin, a key is forced) the mask is left as it is. The grammar still
decides what is valid: this only picks, among what it allows, the way out. The reserve is a
quarter of the budget, at most ``CLOSING_RESERVE``: the schemas of bench/schemas.json close from
anywhere in under 40 tokens.

Only a JSON grammar (a schema, ``json_object``, a forced tool call) is closed so: a grammar that
allows free text (a reply that may call tools) would be narrowed to quotes and brackets.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import llguidance

# numpy is imported where it is used: the engine package is imported by the server without its
# local extra (`wschat-server --help`), where numpy may be absent.

CLOSING_RESERVE = 64
_QUOTE, _COMMA = ord('"'), ord(",")
_BRACKETS = frozenset(b"]}")
_QUOTED = _BRACKETS | {_QUOTE}
_WITH_COMMA = _QUOTED | {_COMMA, ord(" ")}


def reserve_for(budget: int) -> int:
    """How many of a reply's last tokens are spent closing its JSON."""
    return min(CLOSING_RESERVE, budget // 4)


class Closers:
    """A vocabulary's closing tokens, as bitmasks of ``words`` int32 words, in the order they
    are preferred."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab_size: int, words: int) -> None:
        import numpy as np

        self.words = words
        tiers = np.zeros((3, words * 32), dtype=bool)
        for token in range(vocab_size):
            if tokenizer.is_special_token(token):
                continue
            kinds = set(tokenizer.decode_bytes([token]))
            if not kinds:
                continue
            if kinds <= _QUOTED and _QUOTE in kinds:
                tiers[0, token] = True
            elif kinds <= _BRACKETS:
                tiers[1, token] = True
            elif kinds <= _WITH_COMMA and _COMMA in kinds:
                tiers[2, token] = True
        self.tiers = [_packed(tier) for tier in tiers]

    def narrow(self, address: int) -> None:
        """Narrow the allowed tokens of the mask at ``address`` (``words`` int32 words, as
        ``GrammarMatcher.allowed_mask`` checked) to the closing ones, where it allows any."""
        mask = _view(address, self.words)
        for bits in self.tiers:
            narrowed = mask & bits
            if narrowed.any():
                mask[:] = narrowed
                return


def _packed(allowed: Any) -> Any:
    """A bool per token as int32 words, bit ``i % 32`` of word ``i // 32`` for token ``i``."""
    import numpy as np

    return np.packbits(allowed, bitorder="little").view(np.int32).copy()


def _view(address: int, words: int) -> Any:
    """The int32 words at ``address`` as a numpy array over the same memory."""
    import numpy as np

    array = (ctypes.c_int32 * words).from_address(address)
    return np.ctypeslib.as_array(array)

"""A grammar's allowed tokens applied to a batch's logits (``engine/grammar.py`` fills the mask).

The mask is an int32 bitmask ``[rows, ceil(vocab / 32)]``: bit ``i % 32`` of word ``i // 32``
allows token ``i`` (the format llguidance, xgrammar and outlines-core all write). A row the grammar
does not constrain is all ones (``allocate_bitmask``'s fill) and costs next to nothing here.

A JSON grammar's masks are long runs: inside a string nearly every token is allowed, between
values a few. So each row touches only the words that are not uniform on its majority side: in a
row where most words allow something, the words that block some token get their bits applied; in
a row where most words block everything, the words that allow some token are kept (bits
applied), the row is set to -inf and those words put back. Either way a row writes its logits
at most once, where a bit-by-bit ``masked_fill_`` over 262,144 entries reads and writes them all
for every row (``python -m bench.grammar``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..grammar import GrammarMatcher

BITS = 32
# each bit of an int32 word as a mask (bit 31 is the sign)
_BIT_VALUES = torch.tensor(
    [1 << i for i in range(BITS - 1)] + [-(1 << (BITS - 1))], dtype=torch.int32
)


class RowMasks:
    """The masks of a batch's constrained rows: each row's matcher writes its own row of one
    bitmask, and only those rows' logits are masked, so a row without a grammar costs nothing.
    The worker's alone."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._bitmask: torch.Tensor | None = None  # grown to the most rows masked at once

    def apply(
        self, logits: torch.Tensor, matchers: Sequence[GrammarMatcher | None]
    ) -> dict[int, Exception]:
        """Mask ``logits`` ``[rows, vocab]`` (float32, in place) by each row's matcher (None:
        unconstrained); the rows whose matcher failed, with why (the others go on)."""
        rows = [j for j, matcher in enumerate(matchers) if matcher is not None]
        if not rows:
            return {}
        if self._bitmask is None or len(self._bitmask) < len(rows):
            self._bitmask = allocate_bitmask(len(rows), self.vocab_size)
        bitmask = self._bitmask[: len(rows)]
        failed: dict[int, Exception] = {}
        for k, j in enumerate(rows):
            matcher = matchers[j]
            assert matcher is not None
            try:
                matcher.allowed_mask(bitmask[k])
            except Exception as error:
                failed[j] = error
                bitmask[k] = -1
        if len(rows) == len(logits):
            apply_bitmask(logits, bitmask)
        else:
            index = torch.tensor(rows, device=logits.device)
            masked = logits[index]
            apply_bitmask(masked, bitmask)
            logits[index] = masked
        return failed


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS - 1) // BITS


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A bitmask of ``rows`` rows that allows every token."""
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def token_allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token // BITS]) >> (token % BITS)) & 1)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits[r, i]`` to -inf wherever ``bitmask`` blocks token ``i`` of row ``r``.

    ``logits`` is float ``[rows, vocab]`` (contiguous, on the CPU), ``bitmask`` int32
    ``[rows, >= ceil(vocab / 32)]``; ids past the vocabulary are ignored.
    """
    rows, vocab = logits.shape
    whole = vocab // BITS
    words = logits.as_strided((rows, whole, BITS), (logits.stride(0), BITS, 1))
    mask = bitmask[:, :whole]
    opened = mask.bool()  # a word that allows some token
    mostly_closed = opened.sum(-1) * 2 < whole
    not_full = torch.bitwise_not(mask).bool()  # a word that blocks some token
    touched = torch.where(mostly_closed.unsqueeze(-1), opened, not_full)
    at_row, at_word = touched.nonzero(as_tuple=True)
    kept = words[at_row, at_word]
    kept.masked_fill_((mask[at_row, at_word].unsqueeze(-1) & _BIT_VALUES) == 0, -torch.inf)
    tail = None
    if whole * BITS < vocab:  # a last, partial word
        tail = logits[:, whole * BITS :].clone()
        last = bitmask[:, whole : whole + 1] & _BIT_VALUES[: tail.shape[1]]
        tail.masked_fill_(last == 0, -torch.inf)
    closed_rows = mostly_closed.nonzero().squeeze(-1)
    if closed_rows.numel() == rows:
        logits.fill_(-torch.inf)
    elif closed_rows.numel():
        logits[closed_rows] = -torch.inf
    words[at_row, at_word] = kept
    if tail is not None:
        logits[:, whole * BITS :] = tail

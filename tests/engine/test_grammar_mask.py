"""A grammar's bitmask applied to a batch's logits (``local/grammar_mask.py``): the same as
setting every blocked token to -inf one bit at a time, whatever the rows look like."""

from __future__ import annotations

import pytest
import torch
from wschat.server.engine.local.grammar_mask import (
    allocate_bitmask,
    apply_bitmask,
    bitmask_words,
    token_allowed,
)


def bit_by_bit(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)[:, :vocab]
    return logits.masked_fill(bits == 0, -torch.inf)


def one_bit(bit: int) -> int:
    """An int32 word with ``bit`` alone set (bit 31 is the sign)."""
    return -(2**31) if bit == 31 else 1 << bit


def rows_of_every_kind(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Random bits; mostly closed with a few open; mostly open with a few closed; all open (a
    row no grammar constrains); all closed but one token; the last token alone."""
    words = bitmask_words(vocab)
    mask = allocate_bitmask(6, vocab)
    mask[0] = torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, generator=generator)
    mask[1] = 0
    mask[1, : max(1, words // 10)] = 0x0F0F0F0F
    mask[2, words // 3 :: 7] = 0x7FFFFFF0
    mask[4] = 0
    mask[4, words // 2] = 1 << 5
    mask[5] = 0
    mask[5, (vocab - 1) // 32] = one_bit((vocab - 1) % 32)
    return mask


@pytest.mark.parametrize("vocab", [262_144, 1_000, 70, 33, 32])
def test_applying_a_bitmask_blocks_exactly_the_tokens_whose_bit_is_clear(vocab: int) -> None:
    generator = torch.Generator().manual_seed(vocab)
    mask = rows_of_every_kind(vocab, generator)
    logits = torch.randn(mask.shape[0], vocab, generator=generator)
    expected = bit_by_bit(logits, mask)
    apply_bitmask(logits, mask)
    assert torch.equal(logits, expected)


def test_a_row_that_allows_every_token_is_left_as_it_was() -> None:
    mask = allocate_bitmask(3, 4_096)
    mask[1] = 0
    mask[1, 0] = 1
    logits = torch.randn(3, 4_096)
    before = logits.clone()
    apply_bitmask(logits, mask)
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    assert torch.isfinite(logits[1]).sum() == 1 and logits[1, 0] == before[1, 0]


def test_token_allowed_reads_one_bit() -> None:
    mask = allocate_bitmask(2, 100)
    mask[1] = 0
    mask[1, 1] = one_bit(31)  # token 63 alone
    assert token_allowed(mask, 0, 99)
    assert token_allowed(mask, 1, 63) and not token_allowed(mask, 1, 62)
    assert not token_allowed(mask, 1, 0)

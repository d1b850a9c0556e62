"""A JSON reply's last tokens close it (``engine/grammar_close.py``), on the embedded Gemma 3's
tokenizer and the response formats of ``bench/schemas.json``: a picker that never closes
anything of its own (it takes the allowed token a fixed shuffle of the vocabulary ranks first,
as a model in a loop would) still ends with JSON that validates, within its budget."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer
from wschat.server.engine.grammar import GrammarCompiler, GrammarMatcher, ResponseFormat
from wschat.server.engine.grammar_close import reserve_for
from wschat.server.engine.local.grammar_mask import allocate_bitmask

from .test_grammar import FORMATS, VOCAB, compiler, response_format, tokenizer  # noqa: F401

BUDGET = 160
RANKS = list(range(VOCAB))
random.Random(36).shuffle(RANKS)
RANK = torch.tensor(RANKS)  # each token's rank: the picker takes the allowed token ranked first


def allowed(row: torch.Tensor) -> torch.Tensor:
    """A bitmask row as one bool per token."""
    bits = (row.view(torch.uint8).unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1
    return bits.flatten()[:VOCAB].bool()


def allowed_ids(row: torch.Tensor) -> list[int]:
    ids: list[int] = allowed(row).nonzero().flatten().tolist()
    return ids


def drive(matcher: GrammarMatcher, budget: int) -> list[int]:
    """Tokens picked by rank alone until the matcher is complete or the budget is spent."""
    mask = allocate_bitmask(1, VOCAB)
    picked: list[int] = []
    while len(picked) < budget and not matcher.is_complete:
        matcher.allowed_mask(mask[0])
        token = int(torch.where(allowed(mask[0]), RANK, VOCAB).argmin())
        matcher.advance(token)
        picked.append(token)
    return picked


@pytest.mark.parametrize(
    "name", [n for n in FORMATS if FORMATS[n]["response_format"]["type"] != "json_object"]
)
def test_a_reply_that_would_never_close_its_json_closes_within_its_budget_and_validates(
    name: str,
    compiler: GrammarCompiler,  # noqa: F811
    tokenizer: Tokenizer,  # noqa: F811
) -> None:
    matcher = compiler.compile(response_format(name)).matcher(BUDGET)
    picked = drive(matcher, BUDGET)
    text = tokenizer.decode(picked)
    assert matcher.is_complete, text
    assert len(picked) <= BUDGET
    schema = FORMATS[name]["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(text), schema)


def test_without_a_budget_the_same_picker_never_closes(
    compiler: GrammarCompiler,  # noqa: F811
) -> None:
    matcher = compiler.compile(response_format("recipe")).matcher()
    assert len(drive(matcher, BUDGET)) == BUDGET
    assert not matcher.is_complete


def test_the_reserve_is_a_quarter_of_the_budget_at_most_64_tokens() -> None:
    assert [reserve_for(b) for b in (8, 160, 256, 4096)] == [2, 40, 64, 64]


def test_a_grammar_that_allows_text_is_not_narrowed_to_closing_tokens(
    compiler: GrammarCompiler,  # noqa: F811
    tokenizer: Tokenizer,  # noqa: F811
) -> None:
    lark = 'start: /[a-z ]+/ | "{" /[0-9]+/ "}"'
    matcher = compiler.compile(ResponseFormat(lark=lark)).matcher(0)  # closing from the first token
    mask = allocate_bitmask(1, VOCAB)
    matcher.allowed_mask(mask[0])
    assert tokenizer.token_to_id("hello") in allowed_ids(mask[0])

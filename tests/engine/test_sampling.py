"""``RowSampler``: every parameter value PROTOCOL.md allows picks a real token, and the extreme
values pick what their limit does (a temperature near zero is greedy); the nucleus found without
sorting the vocabulary is the sorted one, and draws follow their weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from wschat.server.engine.base import SamplingParams
from wschat.server.engine.local.sampling import RowSampler, draw, nucleus, pick_tokens

from tests.engine.hostile import HOSTILE_PARAMS

VOCAB = 5000
CPU = torch.device("cpu")


def logits(seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, generator=generator) * scale


def sampler(prompt_ids: Sequence[int] = (), **params: Any) -> RowSampler:
    return RowSampler(SamplingParams(max_new_tokens=1, seed=3, **params), prompt_ids, CPU)


@pytest.mark.parametrize("params", HOSTILE_PARAMS, ids=str)
def test_every_allowed_extreme_picks_a_token_of_the_vocabulary(params: dict[str, Any]) -> None:
    seen = list(range(0, VOCAB, 7))
    for seed in range(5):
        token = sampler(seen, **params).pick(logits(seed, scale=30.0))
        assert 0 <= token < VOCAB


@pytest.mark.parametrize("temperature", [1e-45, 5e-324, 1e-300])
def test_a_vanishing_temperature_picks_the_argmax(temperature: float) -> None:
    for seed in range(5):
        row = logits(seed, scale=10.0)
        assert sampler(temperature=temperature).pick(row.clone()) == int(row.argmax())


def test_a_vanishing_penalty_picks_the_best_seen_token() -> None:
    """Dividing the positive logits of seen tokens by ~0 lifts them above every other token,
    and the largest of them wins (their ratios stay finite for logits under 4)."""
    row = logits(1)
    seen = list(range(0, VOCAB, 3))
    best_seen = max((i for i in seen if row[i] > 0), key=lambda i: float(row[i]))
    for seed in range(5):
        pick = sampler(seen, temperature=1.0, repetition_penalty=1e-300)
        pick._generator = torch.Generator().manual_seed(seed)
        assert pick.pick(row.clone()) == best_seen


def test_penalized_logits_that_overflow_share_the_draw_among_themselves() -> None:
    row = logits(2, scale=30.0)  # seen positives over float32's max once divided by ~0
    seen = list(range(0, VOCAB, 3))
    overflowing = {i for i in seen if row[i] > 4.0}
    assert len(overflowing) > 1
    picks = {sampler(seen, temperature=1.0, repetition_penalty=1e-300).pick(row.clone())}
    for seed in range(20):
        row_sampler = sampler(seen, temperature=1.0, repetition_penalty=1e-300)
        row_sampler._generator = torch.Generator().manual_seed(seed)
        picks.add(row_sampler.pick(row.clone()))
    assert picks <= overflowing and len(picks) > 1


def test_pick_tokens_gives_greedy_rows_the_argmax_beside_extreme_rows() -> None:
    rows = torch.stack([logits(seed, scale=10.0) for seed in range(4)])
    samplers = [
        sampler(),
        sampler(temperature=1e-45),
        sampler(list(range(100)), repetition_penalty=1e-300),
        sampler(),
    ]
    picked = pick_tokens(samplers, rows.clone())
    assert picked[0] == int(rows[0].argmax()) and picked[3] == int(rows[3].argmax())
    assert picked[1] == int(rows[1].argmax())
    assert picked[2] in range(100)  # a seen token, lifted by the penalty


def sorted_nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    """The nucleus as generate finds it: sort everything, keep until the mass reaches top_p."""
    values, indices = probs.sort(descending=True)
    before = values.cumsum(-1) - values
    return set(indices[before < top_p].tolist())


@pytest.mark.parametrize("flatness", [0.05, 0.5, 3.0])  # from all-alike to peaked logits
@pytest.mark.parametrize("top_p", [1e-300, 0.3, 0.9, 0.999])
def test_the_nucleus_is_the_one_a_full_sort_gives(flatness: float, top_p: float) -> None:
    probs = (logits(4) * flatness).softmax(-1)
    weights, ids = nucleus(probs, top_p)
    if ids is None:  # weights over the whole vocabulary
        ids = weights.nonzero().squeeze(-1)
        weights = weights[ids]
    assert set(ids.tolist()) == sorted_nucleus(probs, top_p) | {int(probs.argmax())}
    assert torch.equal(weights, probs[ids])


def test_draws_follow_the_weights_and_never_pick_a_zero_weight() -> None:
    weights = torch.tensor([0.0, 1.0, 0.0, 3.0, 0.0])
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([draw(weights, generator) for _ in range(4000)]))
    assert counts[0] == counts[2] == 0 and len(counts) == 4  # index 4 never drawn either
    assert 0.70 < counts[3] / 4000 < 0.80  # 3/4, within a generous margin for 4000 draws


def test_weights_that_are_not_finite_fail_the_draw() -> None:
    with pytest.raises(ValueError, match="not finite and positive"):
        draw(torch.tensor([0.5, float("nan")]), None)
    with pytest.raises(ValueError, match="not finite and positive"):
        draw(torch.zeros(3), None)

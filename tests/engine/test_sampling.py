"""``RowSampler``: every parameter value PROTOCOL.md allows picks a real token, and the extreme
values pick what their limit does (a temperature near zero is greedy); each pick is the one a
sort of the whole vocabulary gives, though nothing the size of the vocabulary is sorted; draws
follow their weights."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from wschat.server.engine.base import SamplingParams
from wschat.server.engine.local import sampling
from wschat.server.engine.local.sampling import (
    RowSampler,
    argmax,
    draw,
    largest,
    pick_tokens,
)

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


GEMMA_VOCAB = 262_144
FILTERS = [
    {"temperature": 1.0, "top_p": 0.95},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 2.0, "top_p": 0.999},
    {"temperature": 1.0, "top_p": 1e-300},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.95},
    {"temperature": 1.0, "top_k": 5000},
    {"temperature": 0.8, "min_p": 0.05},
    {"temperature": 1.0, "min_p": 1e-9},
    {"temperature": 1.0, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 0.8, "top_k": 64, "top_p": 0.9, "min_p": 0.1},
    {"temperature": 1.0},
]


@functools.cache
def gemma_like(seed: int, scale: float) -> torch.Tensor:
    """A row of Gemma 3's vocabulary: a few hundred likely tokens over a long flat tail."""
    generator = torch.Generator().manual_seed(seed)
    row = torch.randn(GEMMA_VOCAB, generator=generator) * scale
    likely = torch.randint(GEMMA_VOCAB, (300,), generator=generator)
    row[likely] += torch.rand(300, generator=generator) * 8 * scale
    return row


@functools.cache
def ranked(row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``row`` sorted, most probable first: once per row, by numpy (torch's CPU sort of 262,144
    entries takes ~0.1 s)."""
    order = torch.from_numpy(np.argsort(-row.numpy(), kind="stable"))
    return row[order], order


def sorted_kept(row: torch.Tensor, params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """What a sort of the whole vocabulary keeps, the filters in generate's order: top-k
    keeps every logit at or above the k-th; top-p the most probable of those, in order, while
    the mass before each is under top_p of theirs; min-p those at least min_p times as
    probable as the first; masses in float64. The kept ids in id order, and their weights."""
    temperature, top_k = params["temperature"], params.get("top_k", 0)
    top_p, min_p = params.get("top_p", 1.0), params.get("min_p", 0.0)
    weights = ((row - row.max()) / temperature).exp_()
    values, order = ranked(row)
    keep = row >= values[top_k - 1] if top_k else torch.ones_like(row, dtype=torch.bool)
    if top_p < 1.0:
        reach = top_p * float(weights[keep].sum(dtype=torch.float64))
        first = weights[order][keep[order]]
        inside = int(((first.cumsum(0, dtype=torch.float64) - first.double()) < reach).sum())
        keep &= weights >= first[max(inside, 1) - 1]
    keep &= weights >= min_p
    ids = keep.nonzero().squeeze(-1)
    return ids, weights[ids]


@pytest.mark.parametrize("scale", [3.0, 1.0, 0.3], ids=["peaked", "gemma", "flat"])
@pytest.mark.parametrize("params", FILTERS, ids=str)
def test_each_pick_is_the_one_a_sort_of_the_vocabulary_gives(
    params: dict[str, Any], scale: float
) -> None:
    """Same logits, same seed: the same token (the draw is sampling.draw's over the kept tokens
    in id order)."""
    for seed in range(2):
        row = gemma_like(seed, scale)
        ids, weights = sorted_kept(row, params)
        for draw_seed in range(4):
            row_sampler = sampler(**params)
            row_sampler._generator = torch.Generator().manual_seed(draw_seed)
            expected = int(ids[draw(weights, torch.Generator().manual_seed(draw_seed))])
            assert row_sampler.pick(row.clone()) == expected, (seed, draw_seed)


def test_a_flat_nucleus_past_the_window_is_found_without_a_sort_and_a_peaked_one_inside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window (at least WINDOW tokens) holds a peaked distribution's nucleus; a flat one's
    reaches past it and is found from a histogram. Neither sorts or ranks anything a tenth the
    size of the vocabulary."""
    sizes: list[int] = []
    for name in ("sort", "topk", "argsort", "kthvalue"):
        method = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *args: Any, _method: Any = method, **kwargs: Any) -> Any:
            sizes.append(self.numel())
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    flat_cuts: list[float] = []
    nucleus_cut = sampling._nucleus_cut

    def counted(*args: Any) -> float:
        flat_cuts.append(nucleus_cut(*args))
        return flat_cuts[-1]

    monkeypatch.setattr(sampling, "_nucleus_cut", counted)
    params: dict[str, Any] = {"temperature": 1.0, "top_p": 0.95}
    sampler(**params).pick(gemma_like(0, 3.0).clone())
    assert not flat_cuts
    sampler(**params).pick(gemma_like(0, 0.3).clone())
    assert len(flat_cuts) == 1
    assert sizes and max(sizes) < GEMMA_VOCAB // 10


def test_argmax_from_block_maxima_is_torchs_first_maximum() -> None:
    rows = torch.stack([gemma_like(seed, 3.0) for seed in range(5)])
    rows[1, 7000] = rows[1, 90_000] = rows[1].max() + 1  # a tie: the first index wins
    rows[2] = 0.0
    assert torch.equal(argmax(rows), rows.argmax(-1))
    assert int(argmax(rows)[1]) == 7000 and int(argmax(rows)[2]) == 0
    odd = torch.randn(3, 1000)  # a vocabulary blocks do not divide
    assert torch.equal(argmax(odd), odd.argmax(-1))


@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_largest_from_block_maxima_are_torchs_topk(k: int) -> None:
    rows = torch.stack([gemma_like(seed, 3.0) for seed in range(3)])
    rows[1, -k:] = rows[1].max() + torch.arange(1, k + 1)  # the largest all in the last block
    for logits in (rows, torch.randn(3, 1000)):  # the second: a vocabulary blocks do not divide
        values, ids = largest(logits, k)
        expected = logits.topk(k, dim=-1)
        assert torch.equal(values, expected.values) and torch.equal(ids, expected.indices)


def test_the_largest_of_equal_logits_are_those_values_at_their_ids() -> None:
    logits = torch.zeros(2, GEMMA_VOCAB)
    logits[0, [5, 9000, 200_000]] = 1.0  # three equal largest, in three blocks
    values, ids = largest(logits, 4)
    assert torch.equal(values, logits.topk(4, dim=-1).values)
    assert sorted(ids[0, :3].tolist()) == [5, 9000, 200_000]
    assert torch.equal(logits.gather(1, ids), values)


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

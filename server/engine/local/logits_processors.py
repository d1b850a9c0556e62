"""sampling.py's repetition penalty and draw as transformers logits processors, in place of
``generate``'s own (the generate engine's sampling: ``sampling_kwargs``), so a reply is sampled
the same way by both local engines.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..base import SamplingParams
from .sampling import Filters, penalize, row_generator, sample


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """``generate``'s keyword arguments that sample as ``params`` say."""
    # generate picks greedily from the scores the processors leave: the penalty's, then
    # Draw's (one finite score, the drawn token). 1.0 and None keep generate's own penalty and
    # warpers out of it, whatever the model's generation_config says.
    processors: list[LogitsProcessor] = []
    if params.repetition_penalty != 1.0:
        processors.append(Penalty(params.repetition_penalty))
    if params.temperature > 0:
        processors.append(Draw(params))
    return {
        "temperature": 1.0,
        "repetition_penalty": 1.0,
        "do_sample": False,
        "top_k": None,
        "top_p": None,
        "min_p": None,
        "logits_processor": LogitsProcessorList(processors),
    }


class Penalty(LogitsProcessor):
    """The repetition penalty of sampling.py, safe for every value the protocol allows, in
    place of generate's own (which turns the extremes into NaN)."""

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return penalize(scores, input_ids, self.penalty)


class Draw(LogitsProcessor):
    """sampling.py's draw (temperature, top-k, top-p, min-p; no sort of the vocabulary, its
    own seeded generator) in place of generate's warpers and multinomial: every score but the
    drawn token's becomes -inf, and generate's greedy pick takes it."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.filters = Filters.of(params)
        self.generator: torch.Generator | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            self.generator = row_generator(self.params, scores.device)
        picked = [sample(row.float(), self.filters, self.generator) for row in scores]
        out = torch.full_like(scores, -torch.inf)
        rows = torch.arange(len(picked), device=scores.device)
        out[rows, torch.tensor(picked, device=scores.device)] = 0.0
        return out

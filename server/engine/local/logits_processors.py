"""sampling.py's repetition penalty and draw as transformers logits processors, in place of
``generate``'s own (the generate engine's sampling: ``sampling_kwargs``), so a reply is sampled
the same way by both local engines; and, where the reply asked, its logprobs read first (the
model's own distribution) and its response format's mask before the draw.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..base import SamplingParams
from ..grammar import GrammarMatcher
from .grammar_mask import RowMasks
from .logprobs import LogprobRecorder, observe
from .sampling import Filters, penalize, row_generator, sample


def sampling_kwargs(
    params: SamplingParams,
    recorder: LogprobRecorder | None = None,
    constrain: LogitsProcessor | None = None,
) -> dict[str, Any]:
    """``generate``'s keyword arguments that sample as ``params`` say."""
    # generate picks greedily from the scores the processors leave: the logprobs read first
    # (the model's own), then the penalty's, the grammar's mask, then Draw's (one finite score,
    # the drawn token). 1.0 and None keep generate's own penalty and warpers out of it,
    # whatever the model's generation_config says.
    processors: list[LogitsProcessor] = []
    if recorder is not None:
        processors.append(Observe(recorder))
    if params.repetition_penalty != 1.0:
        processors.append(Penalty(params.repetition_penalty))
    if constrain is not None:
        processors.append(constrain)
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


class Observe(LogitsProcessor):
    """Each step's logits, as the model gave them, to the reply's logprobs."""

    def __init__(self, recorder: LogprobRecorder) -> None:
        self.recorder = recorder

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        observe([self.recorder], scores.float())
        return scores


class Constrain(LogitsProcessor):
    """The reply's grammar: it takes the token the last step picked, then masks this step's
    scores to what it allows next."""

    def __init__(self, matcher: GrammarMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.masks = RowMasks(vocab_size)
        self._length: int | None = None  # the ids at the last step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if self._length is not None:
            for token in input_ids[0, self._length :].tolist():
                self.matcher.advance(int(token))
        self._length = length
        for error in self.masks.apply(scores, [self.matcher]).values():
            raise error
        return scores


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

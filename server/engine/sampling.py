"""Per-row token choice for a batch: each row its own parameters and random generator.

The order of operations is ``generate``'s: repetition penalty over every token of the sequence
(prompt included), then temperature, top-k and top-p (nucleus), then a draw. A row's draws come
from its own ``torch.Generator``, so a seeded request gives the same tokens whatever else shares
its batch. Top-p never sorts the whole vocabulary when it can help it: the nucleus lies within
the top candidates as soon as their mass reaches ``top_p``, and only a flatter distribution
falls back to a full sort.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from .base import SamplingParams

NUCLEUS_CANDIDATES = 1024


class RowSampler:
    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], device: torch.device):
        self.params = params
        self.greedy = params.temperature == 0
        self.penalized = params.repetition_penalty != 1.0
        self._seen = torch.tensor(sorted(set(prompt_ids)), dtype=torch.long, device=device)
        self._seen_set = set(prompt_ids)
        self._generator: torch.Generator | None = None
        if not self.greedy:
            seed = params.seed if params.seed is not None else secrets.randbits(63)
            self._generator = torch.Generator(device=device).manual_seed(seed)

    @property
    def plain_greedy(self) -> bool:
        """Argmax of the raw logits: rows like this are picked together."""
        return self.greedy and not self.penalized

    def observe(self, token_id: int) -> None:
        if self.penalized and token_id not in self._seen_set:
            self._seen_set.add(token_id)
            extra = torch.tensor([token_id], dtype=torch.long, device=self._seen.device)
            self._seen = torch.cat([self._seen, extra])

    def pick(self, logits: torch.Tensor) -> int:
        """One token from one row's float logits ``[vocab]`` (modified in place)."""
        if self.penalized and self._seen.numel():
            scores = logits[self._seen]
            penalty = self.params.repetition_penalty
            logits[self._seen] = torch.where(scores < 0, scores * penalty, scores / penalty)
        if self.greedy:
            return int(logits.argmax())
        return self._draw(logits / self.params.temperature)

    def _draw(self, logits: torch.Tensor) -> int:
        top_k, top_p = self.params.top_k, self.params.top_p
        if top_k <= 0 and top_p >= 1.0:
            return int(torch.multinomial(logits.softmax(-1), 1, generator=self._generator))
        if top_k > 0:
            values, indices = logits.topk(min(top_k, logits.numel()))
            probs = values.softmax(-1)  # renormalized over the top k, as generate does
        else:
            full = logits.softmax(-1)
            probs, indices = full.topk(min(NUCLEUS_CANDIDATES, full.numel()))
            if float(probs.sum()) < top_p:
                probs, indices = full.sort(descending=True)
        if top_p < 1.0:
            before = probs.cumsum(-1) - probs  # the mass ranked above each candidate
            keep = before < top_p
            keep[0] = True
            probs, indices = probs[keep], indices[keep]
        choice = torch.multinomial(probs, 1, generator=self._generator)
        return int(indices[choice])


def pick_tokens(samplers: Sequence[RowSampler], logits: torch.Tensor) -> list[int]:
    """The next token of every row of ``logits`` ``[rows, vocab]`` (float32)."""
    plain = [i for i, s in enumerate(samplers) if s.plain_greedy]
    if len(plain) == len(samplers):
        return [int(t) for t in logits.argmax(-1).tolist()]
    picked = [0] * len(samplers)
    if plain:
        index = torch.tensor(plain, device=logits.device)
        for i, token in zip(plain, logits[index].argmax(-1).tolist(), strict=True):
            picked[i] = int(token)
    for i, sampler in enumerate(samplers):
        if not sampler.plain_greedy:
            picked[i] = sampler.pick(logits[i])
    return picked

"""Per-row token choice for a batch: each row its own parameters and random generator.

The order of operations is ``generate``'s: repetition penalty over every token of the sequence
(prompt included), then temperature, top-k and top-p (nucleus), then a draw. A row's draws come
from its own ``torch.Generator``, so a seeded request gives the same tokens whatever else shares
its batch.

A row's pick holds up every row of its pass, so no setting may make it cost much more than a
greedy pick: top-k is taken before the temperature (k logits to scale, not the vocabulary), the
nucleus is found without sorting the vocabulary (``nucleus``), and the draw inverts a running
sum (``draw``) where ``torch.multinomial`` over a vocabulary takes ~100x longer on CPU.

Every value PROTOCOL.md "params" allows is safe in float32 (``penalize``, ``tempered``): a
temperature or penalty near zero divides logits into infinities, and one that rounds to 0.0
would make 0/0 a NaN, where ``generate``'s own warpers hand ``multinomial`` NaNs and it raises.
Here the extremes pick what their limit does: a vanishing temperature is greedy; logits lifted
past float32's range by a vanishing penalty share the draw among themselves.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch

from ..base import SamplingParams

NUCLEUS_CANDIDATES = 1024
_BUCKET_SHIFT = 20  # float32 bits >> 20: the exponent and 3 bits of mantissa
_BUCKETS = 1 << (31 - _BUCKET_SHIFT)  # of a non-negative float32


def _safe_divisor(value: float, logits: torch.Tensor) -> float:
    """``value``, or float32's smallest normal when it is below it: dividing by that already
    overflows every logit that matters, and a value that rounds to 0.0 would give 0/0."""
    return max(value, torch.finfo(logits.dtype).tiny)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``generate``'s repetition penalty on the ids ``seen`` of each row, in place.

    ``logits`` is ``[..., vocab]`` and ``seen`` ``[..., n]`` with the same leading dimensions.
    """
    divisor = _safe_divisor(penalty, logits)
    scores = logits.gather(-1, seen)
    return logits.scatter_(-1, seen, torch.where(scores < 0, scores * divisor, scores / divisor))


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` with each row's largest logit moved to 0 first, so no row
    overflows to +inf and every row keeps one finite maximum (softmax never sees NaN).

    Rows that already hold +inf (a penalty divided them past float32's range) keep those
    entries, at 0, and nothing else: the limit of the exact distribution.
    """
    top = logits.amax(-1, keepdim=True)
    overflowed = torch.isposinf(top)
    if bool(overflowed.any()):
        only_infinite = torch.where(torch.isposinf(logits), 0.0, -math.inf)
        logits = torch.where(overflowed, only_infinite, logits)
        top = logits.amax(-1, keepdim=True)
    return (logits - top) / _safe_divisor(temperature, logits)


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
            penalize(logits, self._seen, self.params.repetition_penalty)
        if self.greedy:
            return int(logits.argmax())
        return self._draw(logits)

    def _draw(self, logits: torch.Tensor) -> int:
        top_k, top_p = self.params.top_k, self.params.top_p
        ids: torch.Tensor | None = None
        if 0 < top_k < logits.numel():
            # The top k before the temperature: the same tokens in the same order, and the
            # temperature then touches k logits, not the vocabulary.
            logits, ids = logits.topk(top_k)
        weights = tempered(logits, self.params.temperature).softmax(-1)  # over the top k if any
        if top_p < 1.0:
            weights, ids = nucleus(weights, top_p) if ids is None else _cut(weights, ids, top_p)
        choice = draw(weights, self._generator)
        return choice if ids is None else int(ids[choice])


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fewest most probable tokens whose mass reaches ``top_p``, as weights and the token
    ids they stand for (None: the weights span the vocabulary, zero outside the nucleus).

    The top ``NUCLEUS_CANDIDATES`` hold the nucleus unless the distribution is flat. Then the
    tokens go into buckets by the top bits of their float32 patterns (which order like the
    values), an eighth of an octave each: the buckets above the one where the mass reaches
    ``top_p`` are in the nucleus whole, and only that bucket is sorted. A few passes over the
    vocabulary instead of sorting it, a cost every row of the batch would wait for.
    """
    values, ids = probs.topk(min(NUCLEUS_CANDIDATES, probs.numel()))
    if float(values.sum()) >= top_p:
        return _cut(values, ids, top_p)
    buckets = probs.view(torch.int32) >> _BUCKET_SHIFT
    mass = torch.bincount(buckets, weights=probs, minlength=_BUCKETS)
    reaching = (mass.flip(0).cumsum(0).flip(0) >= top_p).nonzero()  # mass from bucket b up
    edge = int(reaching.max()) if reaching.numel() else 0
    weights = probs * (buckets > edge)
    between = (buckets == edge).nonzero().squeeze(-1)
    ranked = between[probs[between].argsort(descending=True)]
    kept, kept_ids = _cut(probs[ranked], ranked, top_p, float(weights.sum()))
    weights[kept_ids] = kept
    return weights, None


def _cut(
    probs: torch.Tensor, ids: torch.Tensor, top_p: float, above: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates ranked most probable first, kept while the mass ranked above them (``above``
    more than theirs) is under ``top_p``; at least one when nothing is above."""
    before = above + probs.cumsum(-1) - probs
    keep = before < top_p
    keep[0] |= above == 0
    return probs[keep], ids[keep]


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """An index drawn in proportion to ``weights`` (>= 0, any sum) by inverting their running
    sum: ``torch.multinomial`` spends ~100x longer on a whole vocabulary on CPU, a cost every
    row of the batch would wait for."""
    running = weights.cumsum(-1)
    total = running[-1]
    if not bool(torch.isfinite(total)) or float(total) <= 0:
        raise ValueError("the sampling weights are not finite and positive")
    point = torch.rand((), generator=generator, device=weights.device) * total
    point = torch.minimum(point, torch.nextafter(total, torch.zeros_like(total)))  # < total
    return int(torch.searchsorted(running, point[None], right=True))


def pick_tokens(samplers: Sequence[RowSampler], logits: torch.Tensor) -> list[int | Exception]:
    """The next token of every row of ``logits`` ``[rows, vocab]`` (float32); a row whose
    sampler raises gets the exception in its place, so it fails alone (batched.py)."""
    plain = [i for i, s in enumerate(samplers) if s.plain_greedy]
    if len(plain) == len(samplers):
        return [int(t) for t in logits.argmax(-1).tolist()]
    picked: list[int | Exception] = [0] * len(samplers)
    if plain:
        index = torch.tensor(plain, device=logits.device)
        for i, token in zip(plain, logits[index].argmax(-1).tolist(), strict=True):
            picked[i] = int(token)
    for i, sampler in enumerate(samplers):
        if not sampler.plain_greedy:
            try:
                picked[i] = sampler.pick(logits[i])
            except Exception as error:
                picked[i] = error
    return picked

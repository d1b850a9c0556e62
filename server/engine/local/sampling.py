"""Per-row token choice for a batch: each row its own parameters and random generator.

The order of operations is ``generate``'s: repetition penalty over every token of the sequence
(prompt included), then temperature, top-k, top-p (nucleus) and min-p, then a draw. A row's
draws come from its own ``torch.Generator``, so a seeded request gives the same tokens whatever
else shares its batch.

A row's pick holds up every row of its pass, so no setting may make it cost much more than a
greedy pick, and no pick sorts the vocabulary (262,144 entries for Gemma 3). Every filter keeps
the most probable tokens down to a cut, so what a draw may pick is every logit at or above one
value (``kept``). That value is found in a window: every logit at or above the ``WINDOW``-th
largest block maximum, which holds at least ``WINDOW`` tokens and is found from the block
maxima, not by ``topk`` over the vocabulary (``window``). top-k and min-p cut inside it always;
top-p does when the window's mass reaches ``top_p`` of the whole vocabulary's (a
log-sum-exp), and otherwise (a flat distribution) finds its cut from a histogram of the
weights (``_nucleus_cut``). The draw inverts a running sum over the kept tokens in vocabulary
order (``draw``), where ``torch.multinomial`` over a vocabulary takes ~100x longer on CPU.

Ties at a cut are kept together (top-k as transformers' ``TopKLogitsWarper``: every logit at
or above the k-th), so the kept set is a function of the logits alone, whatever order a sort
would put equal values in.

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
from dataclasses import dataclass

import torch

from ..base import SamplingParams

WINDOW = 1024  # tokens at least in the window a cut is looked for in first (vLLM's top-k window)
_WINDOW_BLOCK = 32  # the window's blocks: 8,192 of them for Gemma 3's vocabulary
_ARGMAX_BLOCK = 256
_LARGEST_BLOCK = 512
# (shift, bits) of each level of _nucleus_cut's buckets: a non-negative float32's exponent and
# first 3 bits of mantissa (an eighth of an octave a bucket), then the next 12 bits
_BUCKET_LEVELS = ((20, 11), (8, 12))


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


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of ``[rows, vocab]``, the first of equal maxima as there, from
    each row's block maxima: a vectorized reduction where ``argmax`` over a whole vocabulary is
    not (0.5 ms a row on a Xeon core, ~10x the block maxima)."""
    rows, vocab = logits.shape
    if vocab % _ARGMAX_BLOCK or vocab < 2 * _ARGMAX_BLOCK:
        return logits.argmax(-1)
    blocks = logits.reshape(rows, vocab // _ARGMAX_BLOCK, _ARGMAX_BLOCK)
    best = blocks.amax(-1).argmax(-1)
    within = blocks[torch.arange(rows, device=logits.device), best].argmax(-1)
    return best * _ARGMAX_BLOCK + within


def largest(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.topk(k)`` of ``[rows, vocab]`` (values and ids, the largest first) from the
    ``k`` blocks with the largest maxima, which hold the ``k`` largest logits: ``topk`` over a
    whole vocabulary is not vectorized (0.8 ms a row on a Xeon core, ~12x this). Of equal
    values, the ids may be others than ``topk`` would give."""
    rows, vocab = logits.shape
    blocks = vocab // _LARGEST_BLOCK
    if vocab % _LARGEST_BLOCK or blocks <= k:
        values, ids = logits.topk(k, dim=-1)
        return values, ids
    grouped = logits.reshape(rows, blocks, _LARGEST_BLOCK)
    best = grouped.amax(-1).topk(k, dim=-1).indices  # [rows, k]
    inside = grouped.gather(1, best[..., None].expand(-1, -1, _LARGEST_BLOCK))
    values, at = inside.reshape(rows, k * _LARGEST_BLOCK).topk(k, dim=-1)
    return values, best.gather(1, at // _LARGEST_BLOCK) * _LARGEST_BLOCK + at % _LARGEST_BLOCK


@dataclass(frozen=True, slots=True)
class Filters:
    """What a draw is limited to: temperature > 0; top-k 0 (off) or more; top-p in (0, 1];
    min-p in [0, 1]."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def of(cls, params: SamplingParams) -> Filters:
        return cls(params.temperature, params.top_k, params.top_p, params.min_p)


def window(logits: torch.Tensor, size: int) -> torch.Tensor | None:
    """The ids, in vocabulary order, of every logit at or above the ``size``-th largest of the
    maxima of blocks of ``_WINDOW_BLOCK``: at least ``size`` tokens, the largest included
    (each of those blocks holds one at least as large). None where the window would span
    (about) the vocabulary."""
    vocab = logits.numel()
    blocks = vocab // _WINDOW_BLOCK
    if blocks <= 2 * size:
        return None
    whole = logits[: blocks * _WINDOW_BLOCK].view(blocks, _WINDOW_BLOCK)
    maxima = whole.amax(1)
    floor = maxima.topk(size, sorted=False).values.min()
    hit = (maxima >= floor).nonzero().squeeze(-1)
    inside = (whole[hit] >= floor).nonzero()
    ids = hit[inside[:, 0]] * _WINDOW_BLOCK + inside[:, 1]
    if blocks * _WINDOW_BLOCK < vocab:  # the tail that fills no block
        tail = (logits[blocks * _WINDOW_BLOCK :] >= floor).nonzero().squeeze(-1)
        ids = torch.cat([ids, tail + blocks * _WINDOW_BLOCK])
    return ids


def kept(logits: torch.Tensor, filters: Filters) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The tokens a draw may pick from one row's float32 ``logits`` ``[vocab]``, in vocabulary
    order, and their weights (``exp((logit - max) / temperature)``, not normalized); ids None:
    the weights span the vocabulary, 0 where a token is not kept (a draw never picks it, and
    adding 0 leaves a running sum as it is). Kept: the top-k, then the fewest most probable
    whose mass reaches ``top_p`` of the top-k's, then those at least ``min_p`` times as probable
    as the most probable."""
    top = logits.amax()
    if bool(torch.isposinf(top)):  # a penalty lifted these past float32: the limit's draw
        infinite = torch.isposinf(logits).nonzero().squeeze(-1)
        return infinite, torch.ones(infinite.numel(), device=logits.device)
    temperature = _safe_divisor(filters.temperature, logits)
    vocab = logits.numel()
    k = filters.top_k if 0 < filters.top_k < vocab else 0
    if not k and filters.top_p >= 1.0 and filters.min_p <= 0.0:
        return None, _weights(logits, top, temperature)
    ids = window(logits, max(WINDOW, k))
    values = logits[ids] if ids is not None else logits
    weights = _weights(values, top, temperature)
    top_k = values >= values.topk(k).values[-1] if k else None  # ties at the k-th kept
    cut = filters.min_p
    if filters.top_p < 1.0:
        support = weights if top_k is None else weights[top_k]
        everything = None
        if top_k is None and ids is not None:  # top-p of the whole vocabulary's mass
            everything = _weights(logits, top, temperature)
        reach = filters.top_p * _mass(support if everything is None else everything)
        nucleus = _cut(support, reach)
        if nucleus is None:  # the window holds less than top_p: a flat distribution
            assert everything is not None
            cut = max(cut, _nucleus_cut(everything, reach))
            return None, everything.masked_fill_(everything < cut, 0.0)
        cut = max(cut, nucleus)
    elif top_k is None and ids is not None and bool(weights.min() >= cut):
        # min-p alone, and every token of the window passes it: its cut over the vocabulary
        everything = _weights(logits, top, temperature)
        return None, everything.masked_fill_(everything < cut, 0.0)
    chosen = weights >= cut
    if top_k is not None:
        chosen &= top_k
    if ids is None:
        return None, weights.masked_fill_(~chosen, 0.0)
    return ids[chosen], weights[chosen]


def _weights(logits: torch.Tensor, top: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each logit's weight, its probability times a constant: 1 for the largest."""
    return ((logits - top) / temperature).exp_()


def _mass(weights: torch.Tensor) -> float:
    """The sum of ``weights`` in float64: a cut compares running sums of up to a vocabulary's
    weights, where float32 would be off by more than a flat distribution's smallest weight."""
    return float(weights.sum(dtype=torch.float64))


def _cut(weights: torch.Tensor, reach: float) -> float | None:
    """The weight of the token where the running mass of ``weights``, most probable first,
    reaches ``reach``: every token at or above it is in the nucleus (one at least). None when
    all of them do not reach it."""
    ranked = weights.sort(descending=True).values
    running = ranked.cumsum(0, dtype=torch.float64)
    if float(running[-1]) < reach:
        return None
    inside = int(((running - ranked.double()) < reach).sum())
    return float(ranked[max(inside, 1) - 1])


def _nucleus_cut(weights: torch.Tensor, reach: float) -> float:
    """``_cut`` over a whole vocabulary without sorting it (a flat distribution's nucleus holds
    much of it). The tokens go into buckets by the top bits of their float32 patterns, which
    order like the values: the buckets above the one where the mass reaches ``reach`` are in
    whole, and that bucket's tokens go into buckets by their next bits, and so on; only the
    last bucket's few tokens are sorted."""
    for shift, bits in _BUCKET_LEVELS:
        keys = (weights.view(torch.int32) >> shift) & ((1 << bits) - 1)
        mass = torch.bincount(keys, weights=weights.double(), minlength=1 << bits)
        from_top = mass.flip(0).cumsum(0).flip(0)  # the mass of bucket b and every one above
        reaching = (from_top >= reach).nonzero()
        edge = int(reaching.max()) if reaching.numel() else 0
        reach -= float(from_top[edge + 1]) if edge + 1 < len(from_top) else 0.0
        weights = weights[keys == edge]
    cut = _cut(weights, reach)
    return float(weights.min()) if cut is None else cut


def row_generator(params: SamplingParams, device: torch.device) -> torch.Generator:
    """A reply's own random generator: seeded by its ``seed``, else at random."""
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    return torch.Generator(device=device).manual_seed(seed)


class RowSampler:
    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], device: torch.device):
        self.params = params
        self.filters = Filters.of(params)
        self.greedy = params.temperature == 0
        self.penalized = params.repetition_penalty != 1.0
        self._seen = torch.tensor(sorted(set(prompt_ids)), dtype=torch.long, device=device)
        self._seen_set = set(prompt_ids)
        self._generator = None if self.greedy else row_generator(params, device)

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
            return int(argmax(logits[None])[0])
        return sample(logits, self.filters, self._generator)


def sample(logits: torch.Tensor, filters: Filters, generator: torch.Generator | None) -> int:
    """A token drawn from one row's float32 ``logits`` ``[vocab]`` under ``filters``."""
    ids, weights = kept(logits, filters)
    choice = draw(weights, generator)
    return choice if ids is None else int(ids[choice])


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
        return [int(t) for t in argmax(logits).tolist()]
    picked: list[int | Exception] = [0] * len(samplers)
    if plain:
        index = torch.tensor(plain, device=logits.device)
        for i, token in zip(plain, argmax(logits[index]).tolist(), strict=True):
            picked[i] = int(token)
    for i, sampler in enumerate(samplers):
        if not sampler.plain_greedy:
            try:
                picked[i] = sampler.pick(logits[i])
            except Exception as error:
                picked[i] = error
    return picked

"""A transformers ``DynamicCache`` (``generate``'s) copied, cut back and marked: the opening a
generation keeps for other sessions (``OpeningCopy``), a prefix cut back to what the next prompt
reuses (``crop_cache``), and its sliding layers as a ``RingMark`` at a turn boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from .kvstore import RingMark, latest_mark, window_holds


class OpeningCopy:
    """The first ``length`` positions of the cache ``generate`` fills, copied at its first
    token (the prompt prefilled, nothing more yet): the opening ``KVStore.put_opening`` keeps.
    ``take`` is a stopping rule that never stops (``StopWhen``)."""

    def __init__(self, cache: Any, length: int, config: Any) -> None:
        self._cache, self.length, self._config = cache, length, config
        self.copy: DynamicCache | None = None
        self._taken = length == 0

    def take(self) -> bool:
        if not self._taken:
            self._taken = True
            self.copy = copied_cache(self._cache, self.length, self._config)
        return False


def copied_cache(cache: Any, length: int, config: Any) -> DynamicCache | None:
    """A new ``DynamicCache`` of the first ``length`` positions of ``cache``, in tensors of its
    own (``update`` concatenates into new ones); None where a layer no longer holds every
    one of them (a sliding layer past its window)."""
    copy = DynamicCache(config=config)
    target: Any
    for target, layer in zip(copy.layers, cache.layers, strict=True):
        if not layer.is_initialized:
            continue
        held = layer.keys.shape[-2]
        if held < length or layer.get_seq_length() != held:
            return None
        target.update(layer.keys[..., :length, :], layer.values[..., :length, :])
    return copy


def crop_cache(cache: Any, length: int, marks: Sequence[RingMark] = ()) -> int:
    """Cut a transformers ``DynamicCache`` back in place to its first ``length`` positions, or
    where a sliding layer no longer holds what position ``length`` reads (``window_holds``: its
    sliding layers keep the last ``window - 1`` positions, so only a cache still under the
    window), to the longest length one of ``marks`` serves (``latest_mark``): full layers cut
    back, the sliding ones the mark's. The length it is cut to, 0 where neither holds (then it
    is left as it was). Full layers become views of their tensors, which the next forward's
    concatenation replaces; sliding layers cut short are copies (see ``KVState.cropped``)."""
    total = cache.get_seq_length()
    if length == total:
        return length
    sliding = [layer for layer in cache.layers if getattr(layer, "is_sliding", False)]
    held = [layer for layer in sliding if layer.is_initialized]
    if all(window_holds(total - x.keys.shape[-2], length, x.sliding_window) for x in held):
        cache.crop(length - total)  # a negative count: the tokens to drop
        for layer in held:  # copied: they outlive the cut as the next turn's mark
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        return length
    found = latest_mark(marks, length, sliding[0].sliding_window)
    if found is None:
        return 0
    mark, served = found
    for layer in cache.layers:
        if not getattr(layer, "is_sliding", False):
            layer.crop(mark.length - total)
    for layer, (keys, values) in zip(sliding, mark.ring, strict=True):
        layer.keys, layer.values, layer.cumulative_length = keys, values, mark.length
    return crop_cache(cache, served)  # within what the mark's ring holds


def ring_mark(cache: Any, length: int) -> RingMark:
    """The sliding layers of ``cache`` (``length`` positions) as a mark of that length."""
    layers = [x for x in cache.layers if getattr(x, "is_sliding", False) and x.is_initialized]
    ring_from = max((length - x.keys.shape[-2] for x in layers), default=0)
    return RingMark(length, tuple((x.keys, x.values) for x in layers), ring_from)


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    layers = [layer for layer in cache.layers if layer.is_initialized]
    return [t for layer in layers for t in (layer.keys, layer.values)]

"""One sequence's keys and values outside the batch (``KVState``: the form a session's cache takes
between turns, and a row of ``SlotKV`` is saved to and loaded from), and the layout of the
model's layers that both read (``LayerLayout``: which layers attend fully, which over a sliding
window, and the window).

A sliding-window layer keeps a ring of ``window`` columns where position ``p`` lives in column
``p % window``; a transformers ``DynamicCache`` keeps the last positions in order, and
``ring_of_cache`` turns one into the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .attention import FULL, SLIDING
from .kvstore import RingMark, held_bytes, latest_mark, window_holds

if TYPE_CHECKING:
    from .loader import LoadedModel


@dataclass(slots=True)
class KVState:
    """One sequence's keys and values outside the batch: ``length`` positions."""

    length: int
    full: list[tuple[torch.Tensor, torch.Tensor]]  # per full layer: [kv_heads, length, dim]
    ring: list[tuple[torch.Tensor, torch.Tensor]]  # per sliding layer: [kv_heads, <=window, dim]
    # The first position the rings hold: ``length - window`` once past the window, one more
    # where a column is empty (``of_cache``, or cut back by one: the next token's column).
    ring_from: int

    @property
    def nbytes(self) -> int:
        return held_bytes(self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        return [t for pair in (*self.full, *self.ring) for t in pair]

    def mark(self) -> RingMark:
        """Its rings as a mark at its length (kvstore.RingMark)."""
        return RingMark(self.length, tuple(self.ring), self.ring_from)

    def at_mark(self, mark: RingMark) -> KVState:
        """The state of its first ``mark.length`` positions: the full layers' columns (views),
        the mark's rings."""
        n = mark.length
        full = [(k[:, :n], v[:, :n]) for k, v in self.full]
        return KVState(n, full, list(mark.ring), mark.ring_from)

    @classmethod
    def of_cache(cls, cache: Any, layout: LayerLayout) -> KVState:
        """A transformers ``DynamicCache`` of one sequence (``generate``'s) in this form.

        Its sliding layers keep the last ``window - 1`` positions, which is all the next token
        reads; each goes to its ring column ``p % window``. The one column left empty is the
        one the next token overwrites, and no mask lets anything read it before that.
        """
        length = cache.get_seq_length()
        if len(cache.layers) != len(layout.kinds):
            raise ValueError(f"a cache of {len(cache.layers)} layers for {len(layout.kinds)}")
        full: list[tuple[torch.Tensor, torch.Tensor]] = []
        sliding: list[tuple[torch.Tensor, torch.Tensor]] = []
        for kind, layer in zip(layout.kinds, cache.layers, strict=True):
            (full if kind == FULL else sliding).append((layer.keys, layer.values))
        full = [(k[0], v[0]) for k, v in full]  # [kv_heads, length, dim]
        ring = ring_of_cache(RingMark(length, tuple(sliding), 0), layout.window)
        return cls(length, full, list(ring.ring), ring.ring_from)

    def cropped(self, length: int, window: int) -> KVState | None:
        """The state of its first ``length`` positions (views of its tensors), or None where its
        rings no longer hold what position ``length`` reads (``kvstore.window_holds``).

        Where it is kept, either ``length`` is under the window and each position has its own
        column, or the rings held at most one position past ``length - 1``, in the column of
        position ``length``: the next token overwrites it, and until then attention reads it as
        position ``length - window``, out of the window.
        """
        if not 0 < length <= self.length or not window_holds(self.ring_from, length, window):
            return None
        full = [(k[:, :length], v[:, :length]) for k, v in self.full]
        kept = min(length, window)
        # Rings cut short are copied: they outlive the cut, as the next turn's mark, and a
        # view would hold the columns cut off.
        ring = [(_columns(k, kept), _columns(v, kept)) for k, v in self.ring]
        return KVState(length, full, ring, self.ring_from)

    def cut(self, length: int, marks: Sequence[RingMark], window: int) -> KVState | None:
        """Its first ``length`` positions (``cropped``), or where its rings no longer hold what
        position ``length`` reads, the longest length one of ``marks`` serves (``latest_mark``:
        back to a turn start whose ring was marked); None where neither holds."""
        state = self.cropped(length, window)
        if state is None:
            found = latest_mark(marks, length, window)
            state = None if found is None else self.at_mark(found[0]).cropped(found[1], window)
        return state


def _columns(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if t.shape[1] == n else t[:, :n].clone()


def ring_of_cache(mark: RingMark, window: int) -> RingMark:
    """A mark of a ``DynamicCache``'s sliding layers (``[1, kv_heads, held, dim]``, the last
    ``held`` positions in order) in the batch's form: position ``p`` in column ``p % window``."""
    length = mark.length
    columns = min(length, window)
    ring: list[tuple[torch.Tensor, torch.Tensor]] = []
    ring_from = 0
    for keys, values in mark.ring:
        held = keys.shape[-2]
        ring_from = max(ring_from, length - held)
        slots = torch.remainder(torch.arange(length - held, length), window)
        pair = []
        for source in (keys[0], values[0]):
            target = source.new_zeros((source.shape[0], columns, source.shape[2]))
            target[:, slots.to(source.device)] = source
            pair.append(target)
        ring.append((pair[0], pair[1]))
    return RingMark(length, tuple(ring), ring_from)


@dataclass(frozen=True, slots=True)
class LayerLayout:
    kinds: tuple[str, ...]
    window: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, text_config: Any, dtype: torch.dtype, device: torch.device) -> LayerLayout:
        kinds = tuple(text_config.layer_types)
        unknown = set(kinds) - {FULL, SLIDING}
        if unknown:
            raise ValueError(f"layer types {sorted(unknown)} are not supported by SlotKV")
        return cls(
            kinds,
            int(text_config.sliding_window),
            int(text_config.num_key_value_heads),
            int(text_config.head_dim),
            dtype,
            device,
        )


def layer_layout(loaded: LoadedModel) -> LayerLayout:
    """The layout of the loaded model's text decoder."""
    config = loaded.model.config
    return LayerLayout.of(getattr(config, "text_config", config), loaded.dtype, loaded.model.device)

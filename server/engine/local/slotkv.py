"""``SlotKV``: the KV state of several sequences in preallocated per-layer buffers, one row each.

Rows ``[0, count)`` are occupied; a forward pass runs over a contiguous run of them at once
(``plan``: all of them, or rows ``first`` to ``first + n``), each row at its own position, so
sequences of different lengths decode together without padding copies, and rows that prefill
(the batched engine keeps them after the decoding ones) run their own forward in the same
buffers while the others keep still. Full-attention layers keep every position of a row in
columns ``0..length-1``; sliding-window layers keep a ring of ``window`` columns where position
``p`` lives in column ``p % window`` (the columns are the same for every row, so a row's ring
can be saved and loaded as is). The model reads the cache through ``update`` exactly as it reads
a transformers ``Cache``. Which columns are each row's own, ``plan`` says in one of two forms,
by the forward's attention kernel (``attention.kernel_for``): 4-D boolean masks (True = attend)
passed to the model ready-made, so no padding mask is inferred, or, mask-free, each row's
lengths in a ``SlotBatch`` that the forward passes to our attention function (``attention.py``).

Keys and values cross a row's boundary only as a ``KVState`` (``save``/``load``/``transfer``,
``sequence_kv.py``): the form a session's cache takes between turns in the ``KVStore``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import attention
from .attention import FULL, MASKS, SLIDING, Keys, SlotBatch, offsets
from .sequence_kv import KVState, LayerLayout


@dataclass(slots=True)
class _Plan:
    """Where the tokens of one forward go: row ``first + b`` writes positions
    ``starts[b] + t``."""

    first: int  # the forward runs over rows [first, first + rows)
    rows: int
    width: int  # tokens per row in this forward (rows with fewer are padded at the end)
    real: list[int]  # real tokens per row
    starts: torch.Tensor  # [rows]
    full_len: int  # columns of the full layers that the forward reads
    ring_len: int  # columns of the rings it reads: all of them once a row has wrapped around


class SlotKV:
    def __init__(
        self, layout: LayerLayout, rows: int, capacity: int = 256, kernel: str = MASKS
    ) -> None:
        self.layout = layout
        self.kernel = kernel  # attention.choose_kernel's: how the forwards attend
        self.batch: SlotBatch | None = None  # the planned forward's rows, when mask-free
        self.rows = rows
        self.capacity = capacity
        self.count = 0
        self.lengths: list[int] = []
        self.ring_from: list[int] = []  # each row's, as KVState.ring_from
        self._full: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._ring: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, kind in enumerate(layout.kinds):
            size = capacity if kind == FULL else layout.window
            target = self._full if kind == FULL else self._ring
            target[i] = (self._empty(size), self._empty(size))
        self._plan: _Plan | None = None

    def _empty(self, columns: int) -> torch.Tensor:
        lay = self.layout
        shape = (self.rows, lay.kv_heads, columns, lay.head_dim)
        return torch.zeros(shape, dtype=lay.dtype, device=lay.device)

    # -- rows ----------------------------------------------------------------------------

    def add(self, state: KVState | None = None) -> int:
        """Occupy the next row, empty or holding ``state``; returns its index."""
        if self.count >= self.rows:
            raise RuntimeError("no free row")
        row = self.count
        self.count += 1
        self.lengths.append(0)
        self.ring_from.append(0)
        if state is not None:
            self.load(row, state)
        return row

    def remove(self, row: int) -> None:
        """Free ``row``; the last row moves into it so occupied rows stay ``[0, count)``."""
        last = self.count - 1
        if row != last:
            self.transfer(self, last, row)
        self.count -= 1
        self.lengths.pop()
        self.ring_from.pop()

    def clear(self) -> None:
        self.count = 0
        self.lengths.clear()
        self.ring_from.clear()

    def load(self, row: int, state: KVState) -> None:
        self._reserve(state.length)
        n, kept = state.length, min(state.length, self.layout.window)
        for (k, v), (bk, bv) in zip(state.full, self._full.values(), strict=True):
            bk[row, :, :n] = k
            bv[row, :, :n] = v
        for (k, v), (bk, bv) in zip(state.ring, self._ring.values(), strict=True):
            bk[row, :, :kept] = k
            bv[row, :, :kept] = v
        self.lengths[row] = n
        self.ring_from[row] = state.ring_from

    def save(self, row: int, length: int | None = None) -> KVState:
        """A copy of the row's state, or of its first ``length`` positions while its rings
        still hold each of them in its own column (the row is within the window)."""
        n = self.lengths[row] if length is None else length
        if n < self.lengths[row] and self.lengths[row] > self.layout.window:
            raise ValueError(f"a row of {self.lengths[row]} positions has wrapped its rings")
        kept = min(n, self.layout.window)
        full = [(k[row, :, :n].clone(), v[row, :, :n].clone()) for k, v in self._full.values()]
        ring = [
            (k[row, :, :kept].clone(), v[row, :, :kept].clone()) for k, v in self._ring.values()
        ]
        return KVState(n, full, ring, self.ring_from[row])

    def transfer(self, source: SlotKV, src: int, dst: int) -> None:
        """Copy row ``src`` of ``source`` (this one or another) into row ``dst`` of this one."""
        n = source.lengths[src]
        self._reserve(n)
        kept = min(n, self.layout.window)
        for (sk, sv), (dk, dv) in zip(source._full.values(), self._full.values(), strict=True):
            dk[dst, :, :n] = sk[src, :, :n]
            dv[dst, :, :n] = sv[src, :, :n]
        for (sk, sv), (dk, dv) in zip(source._ring.values(), self._ring.values(), strict=True):
            dk[dst, :, :kept] = sk[src, :, :kept]
            dv[dst, :, :kept] = sv[src, :, :kept]
        self.lengths[dst] = n
        self.ring_from[dst] = source.ring_from[src]

    def swap(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` (their columns in use and their lengths)."""
        if a == b:
            return
        n = max(self.lengths[a], self.lengths[b])
        kept = min(n, self.layout.window)
        for buffers, columns in ((self._full, n), (self._ring, kept)):
            for pair in buffers.values():
                for buffer in pair:
                    held = buffer[a, :, :columns].clone()
                    buffer[a, :, :columns] = buffer[b, :, :columns]
                    buffer[b, :, :columns] = held
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]
        self.ring_from[a], self.ring_from[b] = self.ring_from[b], self.ring_from[a]

    def _reserve(self, columns: int) -> None:
        """Grow the full layers' buffers (doubling) so every row can hold ``columns``. Where
        memory runs out part way, the layers grown so far go back to the old width (a view of
        their new buffers), so the rows' states read as before and a later growth starts from
        one width."""
        if columns <= self.capacity:
            return
        capacity = max(columns, 2 * self.capacity)
        try:
            for i, (k, v) in self._full.items():
                grown_k, grown_v = self._empty(capacity), self._empty(capacity)
                grown_k[:, :, : self.capacity] = k
                grown_v[:, :, : self.capacity] = v
                self._full[i] = (grown_k, grown_v)
        except BaseException:
            old = self.capacity
            for i, (k, v) in self._full.items():
                self._full[i] = (k[:, :, :old], v[:, :, :old])
            raise
        self.capacity = capacity

    # -- one forward pass ----------------------------------------------------------------

    def plan(
        self, tokens: list[int], first: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """Set up a forward of ``tokens[b]`` new tokens for row ``first + b`` (occupied rows
        outside ``[first, first + len(tokens))`` keep still).

        Returns the position ids ``[rows, width]`` and the attention masks by layer type (None
        for a mask-free forward: then ``batch`` holds the rows' lengths).
        """
        rows, width = len(tokens), max(tokens)
        if first < 0 or first + rows > self.count:
            raise ValueError(f"a forward over rows {first}..{first + rows - 1} of {self.count}")
        lengths = self.lengths[first : first + rows]
        device = self.layout.device
        starts = torch.tensor(lengths, dtype=torch.long, device=device)
        full_len = max(lengths) + width
        self._reserve(full_len)
        # Until a row passes the window, position p sits in column p: the columns past the
        # longest row are empty, so attention skips them.
        held = max(lengths) + (1 if width == 1 else 0)
        ring_len = min(self.layout.window, held)
        self._plan = _Plan(first, rows, width, list(tokens), starts, full_len, ring_len)
        kernel = attention.kernel_for(self.kernel, rows, width)
        self.batch = None
        if kernel != MASKS:
            self.batch = self._batch(kernel, lengths, list(tokens))
            positions = starts[:, None] + torch.arange(width, device=device)[None, :]
            return positions, {FULL: None, SLIDING: None}
        steps = torch.arange(width, device=device)
        positions = starts[:, None] + steps[None, :]  # [rows, width]
        columns = torch.arange(full_len, device=device)
        # Padded queries (t >= real) see their row's real tokens too: never an empty softmax.
        full_mask = columns[None, None, :] <= positions[:, :, None]
        masks: dict[str, torch.Tensor | None] = {
            FULL: full_mask[:, None],
            SLIDING: self._sliding_mask(positions, tokens)[:, None],
        }
        return positions, masks

    def attention_kwargs(self) -> dict[str, SlotBatch]:
        """What the planned forward passes to the model besides its inputs: the rows'
        lengths when it runs mask-free (``slots=``, read by ``attention.slot_attention``)."""
        return {} if self.batch is None else {"slots": self.batch}

    def _batch(self, kernel: str, lengths: list[int], tokens: list[int]) -> SlotBatch:
        """The rows' lengths as the kernels read them, in the columns ``update`` returns."""
        device, window = self.layout.device, self.layout.window
        if max(tokens) == 1:  # the new token is in its column before attention reads
            seen = {FULL: [n + 1 for n in lengths], SLIDING: [min(n + 1, window) for n in lengths]}
            seqlens = {
                kind: torch.tensor(counts, dtype=torch.int32, device=device)
                for kind, counts in seen.items()
            }
            if kernel != attention.TORCH_VARLEN:
                return SlotBatch(kernel, window, True, seen, seqlens)
            rows = len(lengths)
            return SlotBatch(
                kernel,
                window,
                True,
                seen,
                seqlens,
                cu_q=offsets([1] * rows, device),
                longest_q=1,
                keys={
                    kind: _keys([list(range(n)) for n in counts], device)
                    for kind, counts in seen.items()
                },
            )
        assert self._plan is not None
        ring_len = self._plan.ring_len
        q_rows: list[int] = []
        q_cols: list[int] = []
        full: list[list[int]] = []
        ring: list[list[int]] = []
        for b, (start, n) in enumerate(zip(lengths, tokens, strict=True)):
            q_rows += [b] * n
            q_cols += range(n)
            full.append(list(range(start + n)))
            # the ring unrolled in position order (what it holds of the last window), then
            # the new tokens, which update puts after the ring's columns
            held = min(start, window)
            ring.append([p % window for p in range(start - held, start)])
            ring[-1] += range(ring_len, ring_len + n)
        return SlotBatch(
            kernel,
            window,
            False,
            {},
            {},
            torch.tensor(q_rows, device=device),
            torch.tensor(q_cols, device=device),
            offsets(tokens, device),
            max(tokens),
            {FULL: _keys(full, device), SLIDING: _keys(ring, device)},
        )

    def _sliding_mask(self, positions: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        assert self._plan is not None
        window, width, ring_len = self.layout.window, self._plan.width, self._plan.ring_len
        device = positions.device
        # Ring column j holds the latest position <= last with p % window == j (< 0: none yet).
        last = self._plan.starts - 1 if width > 1 else self._plan.starts
        ring = torch.arange(ring_len, device=device)
        held = last[:, None] - torch.remainder(last[:, None] - ring[None, :], window)
        if width == 1:  # the new token is written into the ring before attention reads it
            return (held >= 0)[:, None, :]
        # Wider: keys are the ring as it was, then the new tokens (see update).
        real = torch.tensor(tokens, device=device)
        steps = torch.arange(width, device=device)
        new_valid = steps[None, :] < real[:, None]
        keys = torch.cat([held, positions], dim=1)  # [rows, ring_len + width]
        valid = torch.cat([held >= 0, new_valid], dim=1)
        q = positions[:, :, None]
        k = keys[:, None, :]
        mask = valid[:, None, :] & (k <= q) & (k > q - window)
        own = torch.zeros_like(mask)
        own[:, :, ring_len:] = torch.eye(width, dtype=torch.bool, device=device)
        return mask | (own & ~new_valid[:, :, None])

    def advance(self) -> None:
        """After the forward: each row holds its real new tokens, and a whole ring (the first
        new token went to the column a ring may lack)."""
        assert self._plan is not None
        first = self._plan.first
        for b, n in enumerate(self._plan.real):
            self.lengths[first + b] += n
            if n:
                self.ring_from[first + b] = max(0, self.lengths[first + b] - self.layout.window)
        self._plan = None
        self.batch = None

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What a transformers attention layer calls: store the new keys, return what to read."""
        plan = self._plan
        assert plan is not None, "update() outside a planned forward"
        if layer_idx in self._full:
            return self._update_full(self._full[layer_idx], key, value, plan)
        return self._update_ring(self._ring[layer_idx], key, value, plan)

    def _update_full(
        self,
        buffers: tuple[torch.Tensor, torch.Tensor],
        key: torch.Tensor,
        value: torch.Tensor,
        plan: _Plan,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bk, bv = buffers
        first, width, end = plan.first, plan.width, plan.first + plan.rows
        row_ids = torch.arange(first, end, device=key.device)[:, None]
        cols = plan.starts[:, None] + torch.arange(width, device=key.device)[None, :]
        bk[row_ids, :, cols] = key.transpose(1, 2)
        bv[row_ids, :, cols] = value.transpose(1, 2)
        return bk[first:end, :, : plan.full_len], bv[first:end, :, : plan.full_len]

    def _update_ring(
        self,
        buffers: tuple[torch.Tensor, torch.Tensor],
        key: torch.Tensor,
        value: torch.Tensor,
        plan: _Plan,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bk, bv = buffers
        window, first, end = self.layout.window, plan.first, plan.first + plan.rows
        if plan.width == 1:
            row_ids = torch.arange(first, end, device=key.device)
            cols = torch.remainder(plan.starts, window)
            bk[row_ids, :, cols] = key[:, :, 0]
            bv[row_ids, :, cols] = value[:, :, 0]
            return bk[first:end, :, : plan.ring_len], bv[first:end, :, : plan.ring_len]
        keys = torch.cat([bk[first:end, :, : plan.ring_len], key], dim=2)
        values = torch.cat([bv[first:end, :, : plan.ring_len], value], dim=2)
        for b, n in enumerate(plan.real):  # only real tokens enter the ring, the last window
            skip = max(0, n - window)
            start = int(plan.starts[b]) + skip
            cols = torch.remainder(torch.arange(start, start + n - skip, device=key.device), window)
            row = first + b  # an int index stays in place: [heads, n, dim]
            bk[row, :, cols] = key[b, :, skip:n]
            bv[row, :, cols] = value[b, :, skip:n]
        return keys, values


def _keys(columns: list[list[int]], device: torch.device) -> Keys:
    """Each row's key columns, in order, packed as varlen kernels read them."""
    rows = [b for b, cols in enumerate(columns) for _ in cols]
    flat = [c for cols in columns for c in cols]
    counts = [len(cols) for cols in columns]
    return Keys(
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(flat, dtype=torch.long, device=device),
        offsets(counts, device),
        max(counts),
    )

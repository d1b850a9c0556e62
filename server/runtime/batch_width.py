"""The batched engine's default batch width (``--max-concurrent auto``): the width measured best
for the device, never more rows than the memory left after the model can hold.

Each row of the batch keeps KV buffers in one SlotKV (``engine/local/slotkv.py``) that holds
the decoding and the prefilling rows alike, preallocated for ``width`` rows; a full-attention
layer keeps every position of the context, and its buffers grow by doubling, so one may reach
twice the context before it stops; a sliding-window layer keeps a ring of ``window``
positions. The idle sessions' KV budget (``--kv-budget-mib``) comes off the memory first. Pure
arithmetic here; the runtime reads the model's shape and the free memory (``runtime/engines.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..settings import PREFERRED

# Of the memory free once the model is loaded, the share the batch's KV buffers may take: a GPU
# is the engine's alone (the rest: activations, the allocator's slack); RAM is shared with the
# process's own objects and with other processes.
SHARE = {"cpu": 0.75, "cuda": 0.85}
BUFFER_SETS = 1  # one SlotKV for the decoding and the prefilling rows
GROWTH = 2  # a full-attention buffer grows by doubling: up to twice the context


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one position of one sequence costs in each kind of layer."""

    full_layers: int
    sliding_layers: int
    window: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def of(
        cls,
        layer_types: Sequence[str],
        window: int,
        kv_heads: int,
        head_dim: int,
        dtype_bytes: int,
    ) -> KVShape:
        full = sum(1 for kind in layer_types if kind != "sliding_attention")
        return cls(full, len(layer_types) - full, window, kv_heads, head_dim, dtype_bytes)

    @property
    def position_bytes(self) -> int:
        """Keys and values of one position in one layer."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def row_bytes(self, context: int) -> int:
        """The most one row of the batch can hold at ``context`` tokens."""
        columns = self.full_layers * GROWTH * context
        columns += self.sliding_layers * min(self.window, context)
        return BUFFER_SETS * columns * self.position_bytes


@dataclass(frozen=True, slots=True)
class Width:
    width: int
    reason: str


def default_width(device: str, row_bytes: int, free_bytes: int, reserved_bytes: int = 0) -> Width:
    """The device's preferred width, less where ``free_bytes`` (less ``reserved_bytes``, taken
    first) cannot hold that many rows of ``row_bytes``; at least 1."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    preferred, share = PREFERRED[kind], SHARE[kind]
    room = max(0, int(free_bytes * share) - reserved_bytes)
    fits = room // row_bytes if row_bytes > 0 else preferred
    width = max(1, min(preferred, fits))
    mib = 1 << 20
    reason = (
        f"{width} ({kind}: {preferred} measured best; {fits} rows of {row_bytes / mib:.0f} MiB fit "
        f"in {share:.0%} of {free_bytes / mib:.0f} MiB free less {reserved_bytes / mib:.0f} MiB "
        "for idle sessions' KV)"
    )
    return Width(width, reason)

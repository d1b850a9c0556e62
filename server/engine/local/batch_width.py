"""The batched engine's width where none is given (``LocalEngineOptions.width`` None, the
server's ``--max-concurrent auto``): the width measured best for the device, never more rows
than the memory left after the model can hold.

Each row of the batch keeps KV buffers in one ``SlotKV`` (``slotkv.py``) that holds the decoding
and the prefilling rows alike, preallocated for ``width`` rows, one buffer per layer of the
model's ``LayerLayout``: a full-attention layer keeps every position of the context, and its
buffers grow by doubling, so one may reach twice the context before it stops; a sliding-window
layer keeps a ring of ``window`` positions. The idle sessions' KV budget comes off the memory
first.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention import SLIDING
from .loader import LoadedModel
from .memory import free_bytes
from .sequence_kv import LayerLayout

# The width where memory is no limit (settings.PREFERRED repeats it for the option's text
# without importing the engine; a test keeps the two equal). `python -m bench --only widths`
# measures the CPU's, bench/gpu.py the GPU's: wider is better while a step over more rows costs
# far less than several narrower steps.
PREFERRED = {"cpu": 32, "cuda": 64}
# Of the memory free once the model is loaded, the share the batch's KV buffers may take: a GPU
# is the engine's alone (the rest: activations, the allocator's slack); RAM is shared with the
# process's own objects and with other processes.
SHARE = {"cpu": 0.75, "cuda": 0.85}
BUFFER_SETS = 1  # one SlotKV for the decoding and the prefilling rows
GROWTH = 2  # a full-attention buffer grows by doubling: up to twice the context


def row_bytes(layout: LayerLayout, context: int) -> int:
    """The most one row of the batch can hold at ``context`` tokens."""
    sliding = sum(1 for kind in layout.kinds if kind == SLIDING)
    columns = (len(layout.kinds) - sliding) * GROWTH * context
    columns += sliding * min(layout.window, context)
    return BUFFER_SETS * columns * position_bytes(layout)


def position_bytes(layout: LayerLayout) -> int:
    """Keys and values of one position in one layer."""
    return 2 * layout.kv_heads * layout.head_dim * layout.dtype.itemsize


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


def width_for(loaded: LoadedModel, layout: LayerLayout, context: int, reserved_bytes: int) -> Width:
    """The width for the loaded model's rows at ``context`` tokens, in the memory its device has
    free less ``reserved_bytes`` (the idle sessions' KV state, on the same device)."""
    return default_width(
        loaded.device, row_bytes(layout, context), free_bytes(loaded.device), reserved_bytes
    )

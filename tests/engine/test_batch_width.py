"""The batched engine's width where none is given: the device's preferred width, capped by the
memory the KV rows of its ``LayerLayout`` need (pure arithmetic)."""

from __future__ import annotations

import pytest
import torch
from wschat.server.engine.local import batch_width
from wschat.server.engine.local.batch_width import default_width, position_bytes, row_bytes
from wschat.server.engine.local.sequence_kv import LayerLayout
from wschat.server.settings import PREFERRED

MIB = 1 << 20
GIB = 1 << 30
# Gemma 3 270M: 18 layers, every sixth full attention, one KV head of 256, a 512-token window
GEMMA_270M = ("sliding_attention",) * 5 + ("full_attention",)
CPU = torch.device("cpu")


def layout(
    kinds: tuple[str, ...], window: int, heads: int, dim: int, dtype: torch.dtype
) -> LayerLayout:
    return LayerLayout(kinds, window, heads, dim, dtype, CPU)


def test_the_settings_say_the_engines_preferred_widths() -> None:
    assert PREFERRED == batch_width.PREFERRED


def test_a_position_holds_keys_and_values_of_every_head() -> None:
    assert position_bytes(layout(GEMMA_270M * 3, 512, 1, 256, torch.bfloat16)) == 2 * 256 * 2


def test_a_row_holds_full_layers_at_twice_the_context_and_rings_at_the_window() -> None:
    gemma = layout(GEMMA_270M * 3, 512, 1, 256, torch.bfloat16)
    per_set = (3 * 2 * 8192 + 15 * 512) * 1024
    assert row_bytes(gemma, 8192) == per_set == 55.5 * MIB


def test_a_ring_never_holds_more_than_the_context() -> None:
    ring = layout(("sliding_attention",), 512, 1, 4, torch.int8)
    assert row_bytes(ring, 100) == 100 * 8  # 100 positions, keys and values of 4 bytes


@pytest.mark.parametrize(("device", "kind"), [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda")])
def test_with_memory_to_spare_the_width_is_the_devices_preferred(device: str, kind: str) -> None:
    chosen = default_width(device, 100 * MIB, 1000 * GIB, 1 * GIB)
    assert chosen.width == PREFERRED[kind]
    assert chosen.reason.startswith(f"{PREFERRED[kind]} ({kind}: ")


def test_the_width_is_what_the_free_memorys_share_holds_after_the_idle_kv_budget() -> None:
    # cpu: 75% of 8 GiB is 6144 MiB, less 1024 for idle sessions: 5120 MiB, 12 rows of 400
    assert default_width("cpu", 400 * MIB, 8 * GIB, 1 * GIB).width == 12
    # cuda: 85% of 20 GiB is 17408 MiB, less 1024: 16384 MiB, 10 rows of 1600
    assert default_width("cuda", 1600 * MIB, 20 * GIB, 1 * GIB).width == 10


def test_gemma_3_12b_gets_fewer_rows_than_preferred_where_the_context_needs_them() -> None:
    # 48 layers, 8 of them full, 8 KV heads of 256, a 1024-token window, bf16: 1.3 GiB a row at
    # 8K of context, 64 rows fit on a 141 GB GPU; at 32K a row takes 4.3 GiB and 21 fit
    shape = layout(GEMMA_270M * 8, 1024, 8, 256, torch.bfloat16)
    free = 141 * 10**9 - 23_500_000_000  # less the weights
    assert default_width("cuda", row_bytes(shape, 8192), free, 1 * GIB).width == 64
    assert default_width("cuda", row_bytes(shape, 32768), free, 1 * GIB).width < 64


def test_the_width_is_one_row_at_least_when_memory_holds_none() -> None:
    chosen = default_width("cpu", 111 * MIB, 1 * GIB, 1 * GIB)
    assert chosen.width == 1
    assert "0 rows of 111 MiB fit in 75% of 1024 MiB free less 1024 MiB" in chosen.reason

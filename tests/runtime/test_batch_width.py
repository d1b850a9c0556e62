"""``--max-concurrent auto``: the batch width for the device, capped by the memory the KV rows
need (the pure arithmetic), and the width the batched engine and the slots end up with."""

from __future__ import annotations

from pathlib import Path

import pytest
from wschat.server.runtime.batch_width import KVShape, default_width
from wschat.server.runtime.cli import HELP_HINT, settings_from_args
from wschat.server.runtime.engines import make_engine
from wschat.server.settings import PREFERRED, Settings

MIB = 1 << 20
GIB = 1 << 30
# Gemma 3 270M: 18 layers, every sixth full attention, one KV head of 256, a 512-token window
GEMMA_270M = ["sliding_attention"] * 5 + ["full_attention"]


def test_a_shape_counts_its_full_and_sliding_layers() -> None:
    shape = KVShape.of(GEMMA_270M * 3, 512, 1, 256, 2)
    assert (shape.full_layers, shape.sliding_layers) == (3, 15)
    assert shape.position_bytes == 2 * 256 * 2  # keys and values, bf16


def test_a_row_holds_full_layers_at_twice_the_context_and_rings_at_the_window() -> None:
    shape = KVShape.of(GEMMA_270M * 3, 512, 1, 256, 2)
    per_set = (3 * 2 * 8192 + 15 * 512) * 1024
    assert shape.row_bytes(8192) == per_set == 55.5 * MIB


def test_a_ring_never_holds_more_than_the_context() -> None:
    shape = KVShape.of(["sliding_attention"], 512, 1, 4, 1)
    assert shape.row_bytes(100) == 100 * 8  # 100 positions, keys and values of 4 bytes


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
    shape = KVShape.of(GEMMA_270M * 8, 1024, 8, 256, 2)
    free = 141 * 10**9 - 23_500_000_000  # less the weights
    assert default_width("cuda", shape.row_bytes(8192), free, 1 * GIB).width == 64
    assert default_width("cuda", shape.row_bytes(32768), free, 1 * GIB).width < 64


def test_the_width_is_one_row_at_least_when_memory_holds_none() -> None:
    chosen = default_width("cpu", 111 * MIB, 1 * GIB, 1 * GIB)
    assert chosen.width == 1
    assert "0 rows of 111 MiB fit in 75% of 1024 MiB free less 1024 MiB" in chosen.reason


@pytest.mark.parametrize(("value", "width"), [("auto", None), ("Auto", None), ("12", 12)])
def test_the_max_concurrent_flag_reads_auto_or_a_count(value: str, width: int | None) -> None:
    assert settings_from_args(["--max-concurrent", value]).max_concurrent == width


def test_max_concurrent_is_auto_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WSCHAT_MAX_CONCURRENT", raising=False)
    assert settings_from_args([]).max_concurrent is None


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_max_concurrent_is_refused_with_a_clear_message(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        settings_from_args(["--max-concurrent", value])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "wschat-server: error: argument --max-concurrent: expected 'auto' or a whole number of "
        f"generations, 1 or more (from the flag or WSCHAT_MAX_CONCURRENT); got '{value}'",
        HELP_HINT,
    ]


@pytest.mark.parametrize(("asked", "width"), [(None, PREFERRED["cpu"]), (3, 3)])
async def test_the_batched_engine_gets_the_asked_width_or_the_cpu_default(
    tiny_text_dir: Path, asked: int | None, width: int
) -> None:
    # the tiny model's rows take a few MiB: any machine that runs the tests holds the default
    settings = Settings(model=str(tiny_text_dir), dtype="fp32", max_concurrent=asked)
    engine = make_engine(settings)
    try:
        assert engine.info.batch_width == width
    finally:
        await engine.aclose()


async def test_the_generate_engine_says_no_batch_width(tiny_text_dir: Path) -> None:
    engine = make_engine(Settings(model=str(tiny_text_dir), dtype="fp32", engine="generate"))
    try:
        assert engine.info.batch_width is None
    finally:
        await engine.aclose()

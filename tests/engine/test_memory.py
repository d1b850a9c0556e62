"""``free_bytes``: the RAM the kernel says is available, on a CPU; ``out_of_memory``: which
failures are memory running out."""

from __future__ import annotations

from pathlib import Path

import torch
from wschat.server.engine import EngineOverloaded
from wschat.server.engine.local.memory import free_bytes, out_of_memory


def test_on_a_cpu_free_bytes_is_memavailable() -> None:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if "MemAvailable" in x)
    available = int(line.split()[1]) * 1024
    # read a moment apart: other processes move it a little
    assert abs(free_bytes("cpu") - available) < available // 10


def test_only_memory_running_out_ends_a_reply_overloaded() -> None:
    failure = out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert isinstance(failure, EngineOverloaded)
    assert (failure.retry_s, failure.message) == (1.0, "the engine is out of memory; retry in 1 s")
    assert "Tried to allocate 2 GiB" in failure.detail  # for the log, never sent
    assert out_of_memory(MemoryError()) is not None
    for bug in (RuntimeError("shape mismatch"), ValueError("can't allocate memory"), KeyError()):
        assert out_of_memory(bug) is None

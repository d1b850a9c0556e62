"""``free_bytes``: the RAM the kernel says is available, on a CPU."""

from __future__ import annotations

from pathlib import Path

from wschat.server.engine.local.memory import free_bytes


def test_on_a_cpu_free_bytes_is_memavailable() -> None:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if "MemAvailable" in x)
    available = int(line.split()[1]) * 1024
    # read a moment apart: other processes move it a little
    assert abs(free_bytes("cpu") - available) < available // 10

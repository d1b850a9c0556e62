"""The CPU cores this process may use: its affinity, capped by a cgroup CPU quota (``docker
--cpus``). Torch-free, for every engine that sizes a thread pool."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return max(1, min(cores, quota)) if quota else max(1, cores)


def cgroup_cpu_limit(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole cores of a cgroup v2 quota (rounded up), or None where there is none."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))

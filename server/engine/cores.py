"""The CPU cores this process may use (its affinity, capped by a cgroup CPU quota: ``docker
--cpus``), the cores other processes keep busy on them, and the thread count ``auto`` picks from
both. Torch-free, for every engine that sizes a thread pool: torch's, re-read as it works
(``local/threads.py``), and llama.cpp's server, whose count is fixed as it starts.

Why the rule leaves out a thread per busy core: a thread pool splits each operation evenly over
its threads and waits for the slowest, and a decode step is some hundreds of operations. While
another process keeps one of the cores busy, the thread that shares that core runs a fraction of
the time and every operation waits for it, so one stream can fall to a small fraction of one
thread's speed. With the cores free, more threads are faster.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
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


# How often an engine whose threads can change re-reads the others' load while it works.
SAMPLE_INTERVAL_S = 0.5
# A reading over a longer window (the engine sat idle) says little about now: a new one starts.
STALE_WINDOW_S = 2.0
# Other processes' load below this share of a core leaves every core to us: a busy client or
# daemon costs two threads less than a core given up would.
SPARE_CORE = 0.35

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest is inside user)


def threads_for(others: float, cores: int) -> int:
    """Threads to use while other processes keep ``others`` cores busy (of ``cores``)."""
    return max(1, min(cores, math.floor(cores - others + SPARE_CORE)))


class OthersLoad:
    """The cores that other processes kept busy on our CPUs since the previous reading.

    Busy time of our CPUs (``/proc/stat``, steal included: a hypervisor that runs another guest
    on our core is a busy neighbour too) minus this process's own CPU time.
    """

    def __init__(
        self,
        cpus: set[int],
        stat: Path = Path("/proc/stat"),
        own_cpu_s: Callable[[], float] = lambda: sum(os.times()[:2]),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpus = {f"cpu{n}" for n in cpus}
        self._stat = stat
        self._own_cpu_s = own_cpu_s
        self._clock = clock
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()

    @property
    def readable(self) -> bool:
        return self._last is not None

    def _read(self) -> tuple[float, float, float] | None:
        """(wall s, busy s of our CPUs, our own CPU s), or None where there is no /proc/stat."""
        try:
            lines = self._stat.read_text().splitlines()
        except OSError:
            return None
        busy = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in self._cpus:
                values = rest.split()
                busy += sum(int(values[i]) for i in _BUSY_FIELDS if i < len(values))
        return self._clock(), busy / self._tick, self._own_cpu_s()

    def sample(self) -> float | None:
        """Cores kept busy by others since the last call; None where it cannot be told or the
        last call is too long ago (the next call reads from this one)."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or not 0 < now[0] - last[0] <= STALE_WINDOW_S:
            return None
        others = (now[1] - last[1]) - (now[2] - last[2])
        return max(0.0, others / (now[0] - last[0]))


def threads_now(
    cores: int | None = None,
    *,
    window_s: float = SAMPLE_INTERVAL_S,
    load: OthersLoad | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, float | None]:
    """``auto``'s count for a pool sized once: ``threads_for`` the cores other processes keep
    busy over the next ``window_s`` (every usable core where that cannot be read), and that
    load (None: unknown)."""
    cores = cores or usable_cores()
    if load is None:
        try:
            load = OthersLoad(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return cores, None
    if not load.readable:
        return cores, None
    sleep(window_s)
    others = load.sample()
    return (cores, None) if others is None else (threads_for(others, cores), others)

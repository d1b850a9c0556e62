"""How many CPU threads torch uses in an engine's worker: a fixed count, or ``auto``.

Why ``auto`` follows the other processes: torch splits each operation evenly over its OpenMP
threads and waits for the slowest, and a decode step is some hundreds of such operations. While
another process keeps one of the cores busy, the thread that shares that core runs a fraction of
the time and every operation waits for it, so one stream can fall to a small fraction of one
thread's speed. With the cores free, two threads beat one. So ``auto`` uses every usable core
while the cores are free and leaves out one for each core that other processes keep busy,
re-read from ``/proc/stat`` every half second while the engine works (``python -m bench --only
threads`` measures it against fixed counts). Where ``/proc/stat`` cannot be read it keeps every
usable core.

torch's thread count is per thread (OpenMP's setting is), so each worker applies it itself with
``ThreadPolicy.apply``: the batched engine's worker before each pass, a ``generate`` thread when
its reply starts. It reads the count back in the worker; ``/metrics`` reports it as
``wschat_engine_threads``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..cores import usable_cores

log = logging.getLogger("wschat.engine.threads")

SAMPLE_INTERVAL_S = 0.5
# A reading over a longer window (the engine sat idle) says little about now: start a new one,
# and read it after the first pass or so, not a whole interval of passes at a stale count.
STALE_WINDOW_S = 2.0
FIRST_WINDOW_S = 0.1
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


class ThreadPolicy:
    """The CPU thread count of an engine's workers: ``fixed`` threads, or ``auto`` (None)."""

    def __init__(
        self,
        fixed: int | None = None,
        *,
        cores: int | None = None,
        load: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fixed is not None and fixed < 1:
            raise ValueError(f"threads must be 1 or more, got {fixed}")
        self.fixed = fixed
        self.cores = cores or usable_cores()
        # what auto reads the others' load from; a fixed count reads nothing
        self._load = None if fixed is not None else load or _proc_load()
        self._clock = clock
        self._next_sample = clock()
        # the count the policy wants now; written by whichever worker samples (one at a time)
        self._lock = threading.Lock()
        self.wanted = fixed or self.cores
        self.others: float | None = None
        self.in_worker: int | None = None  # torch's count as last read inside a worker

    @property
    def reason(self) -> str:
        """One line for the start-up log: the count and why."""
        if self.fixed is not None:
            return f"{self.fixed} (asked for with --threads / WSCHAT_THREADS)"
        if self._load is None:
            return (
                f"auto: {self.cores}, one per usable core (other processes' load cannot be "
                "read here: no /proc/stat)"
            )
        return (
            f"auto: {self.cores} (one per usable core) while the cores are free, one fewer for "
            "each core other processes keep busy (re-read every "
            f"{SAMPLE_INTERVAL_S:g} s while generating)"
        )

    def apply(self) -> int:
        """In a worker thread: set torch's count for this thread to what the policy wants now."""
        wanted = self._update()
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
        self.in_worker = torch.get_num_threads()
        return self.in_worker

    def _update(self) -> int:
        if self._load is None or self._clock() < self._next_sample:
            return self.wanted
        with self._lock:
            if self._clock() >= self._next_sample:
                self._read(self._load)
        return self.wanted

    def _read(self, load: Callable[[], float | None]) -> None:
        others = load()
        wait = SAMPLE_INTERVAL_S if others is not None else FIRST_WINDOW_S
        self._next_sample = self._clock() + wait
        if others is None:
            return
        self.others = others
        wanted = threads_for(others, self.cores)
        if wanted != self.wanted:
            log.debug(
                "CPU threads: %d (other processes kept %.2f of %d cores busy)",
                wanted,
                others,
                self.cores,
            )
        self.wanted = wanted


def _proc_load() -> Callable[[], float | None] | None:
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None
    load = OthersLoad(cpus)
    return load.sample if load.readable else None

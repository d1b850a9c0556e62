"""How many CPU threads torch uses in an engine's worker: a fixed count, or ``auto``.

``auto`` is ``engine/cores.py``'s rule (and why it follows the other processes): every usable
core while the cores are free, one fewer for each core that other processes keep busy, re-read
from ``/proc/stat`` every half second while the engine works (``python -m bench --only
threads`` measures it against fixed counts). Where ``/proc/stat`` cannot be read it keeps every
usable core.

torch's thread count is per thread (OpenMP's setting is), so each worker applies it itself with
``ThreadPolicy.apply``: the batched engine's worker before each pass, a ``generate`` thread when
its reply starts. It reads the count back in the worker; ``/metrics`` reports it as
``wschat_engine_threads``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import torch

from ..cores import SAMPLE_INTERVAL_S, OthersLoad, threads_for, usable_cores

log = logging.getLogger("wschat.engine.threads")

# after a reading that said nothing (the engine sat idle), the next comes after the first pass
# or so, not a whole interval of passes at a stale count
FIRST_WINDOW_S = 0.1


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

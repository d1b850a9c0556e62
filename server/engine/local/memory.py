"""How much memory the device has free for the engine, once the model is loaded, and what a
generation that ran out of it ends with."""

from __future__ import annotations

import os

import torch

from ..errors import EngineOverloaded

# Memory frees as the other replies end: a retry soon after is likely to fit.
RETRY_AFTER_OOM_S = 1.0
# torch's CPU allocator raises a plain RuntimeError, which names it
_CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"


def free_bytes(device: str) -> int:
    """The GPU's free memory (the model already on it), or the RAM the kernel says is available
    (``MemAvailable``: free, plus the caches it can drop)."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def out_of_memory(error: BaseException) -> EngineOverloaded | None:
    """What a generation that failed with ``error`` ends with when the GPU's memory or the
    host's ran out: ``overloaded`` with when to retry (capacity, not a bug); None otherwise."""
    if not (
        isinstance(error, torch.OutOfMemoryError | MemoryError)
        or (isinstance(error, RuntimeError) and _CPU_ALLOCATOR_FAILED in str(error))
    ):
        return None
    return EngineOverloaded.retry_in(
        "the engine is out of memory", RETRY_AFTER_OOM_S, detail=f"{type(error).__name__}: {error}"
    )


def give_back(device: torch.device) -> None:
    """Hand the blocks that a failed step's tensors held back to the GPU (torch's caching
    allocator keeps them otherwise); on a CPU freed memory is the allocator's already."""
    if device.type == "cuda":
        torch.cuda.empty_cache()

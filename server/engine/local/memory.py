"""How much memory the device has free for the engine, once the model is loaded."""

from __future__ import annotations

import os

import torch


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

"""The pages of shared libraries a load mapped and read once, handed back to the kernel.

An ahead-of-time package (``int8head.py``) is a shared library with its weight in a read-only
section: loading it copies that section into the model's own buffer, and the pages read on the
way stay mapped, counted in the process's resident memory a second time (160 MB per package of
the embedded model's head). A clean page of a private file mapping is the file's bytes, so
dropping it (``MADV_DONTNEED``) changes nothing a later read sees: the kernel reads it again.
Only read-only mappings none of whose pages the process wrote are dropped (``Anonymous`` 0 in
``smaps``: a page written, a relocated one, is the process's own copy and would lose its
writes; a page the file's writer left dirty in the page cache is the file's and stays so).
Linux only; elsewhere nothing is dropped.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from pathlib import Path

_MAPS = Path("/proc/self/smaps")
_SMALLEST = 1 << 20  # mappings under a MiB are code and headers, not sections of weights


def mapped_files() -> set[str]:
    """The files this process has mapped now."""
    return {mapping[0] for mapping in _mappings()}


def drop_clean_pages(before: set[str]) -> int:
    """Drop the resident pages of the clean read-only mappings of a MiB or more of files mapped
    since ``before`` (``mapped_files``); the bytes dropped."""
    madvise, advice = _madvise(), getattr(mmap, "MADV_DONTNEED", None)
    if madvise is None or advice is None:
        return 0
    dropped = 0
    for path, start, end, clean in _mappings():
        big = end - start >= _SMALLEST
        if path not in before and clean and big and madvise(start, end - start, advice) == 0:
            dropped += end - start
    return dropped


def _mappings() -> list[tuple[str, int, int, bool]]:
    """Each mapping of a file: (path, start, end, read-only with no page written)."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return []
    out: list[tuple[str, int, int, bool]] = []
    of_a_file = False  # the mapping whose fields follow is a file's
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if fields[0].endswith(":"):  # a field of the mapping above
            if of_a_file and fields[0] == "Anonymous:" and fields[1] != "0":
                path, start, end, _ = out[-1]
                out[-1] = (path, start, end, False)  # a page written: never dropped
            continue
        of_a_file = len(fields) >= 6 and fields[5].startswith("/")
        if of_a_file:
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            out.append((fields[5], start, end, fields[1] == "r--p"))
    return out


def _madvise() -> Callable[[int, int, int], int] | None:
    try:
        call = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    madvise: Callable[[int, int, int], int] = call
    return madvise

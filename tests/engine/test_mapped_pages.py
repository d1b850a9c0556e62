"""The pages of files mapped and read once, handed back (engine/local/mapped_pages.py): a clean
read-only mapping's resident pages drop and read back the file's bytes; a mapping the process
wrote to keeps its pages and its writes."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from wschat.server.engine.local.mapped_pages import drop_clean_pages, mapped_files

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
SIZE = 4 << 20  # past the MiB under which a mapping is left alone


def resident_kib(path: Path) -> int:
    """The resident KiB of this process's mappings of ``path``."""
    total, current = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].endswith(":"):
            current = len(fields) >= 6 and fields[5] == str(path)
        elif current and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@contextlib.contextmanager
def mapped(path: Path, **options: int) -> Iterator[mmap.mmap]:
    """A new file of SIZE bytes at ``path``, mapped privately with ``options``."""
    path.write_bytes(bytes(range(256)) * (SIZE // 256))
    with path.open("rb") as file:
        mapping = mmap.mmap(file.fileno(), SIZE, **options)
    try:
        yield mapping
    finally:
        mapping.close()


def test_a_read_only_mapping_read_once_gives_its_pages_back_and_reads_the_same_bytes(
    tmp_path: Path,
) -> None:
    path, before = tmp_path / "weights.bin", mapped_files()
    with mapped(path, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as mapping:
        first = bytes(mapping)  # every page read: resident
        assert resident_kib(path) == SIZE // 1024
        assert drop_clean_pages(before) == SIZE
        assert resident_kib(path) == 0
        assert bytes(mapping) == first


def test_a_read_only_mapping_the_process_wrote_before_keeps_its_pages_and_writes(
    tmp_path: Path,
) -> None:
    """As a library's relocated section: written, then made read-only (``mprotect``)."""
    before = mapped_files()
    with mapped(tmp_path / "relocated.bin", access=mmap.ACCESS_COPY) as written:
        written[:4] = b"ours"  # a private copy of that page: the process's own
        start = ctypes.c_char.from_buffer(written)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(ctypes.addressof(start), SIZE, mmap.PROT_READ) == 0
        del start
        assert drop_clean_pages(before) == 0
        assert written[:4] == b"ours"

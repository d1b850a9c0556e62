"""Which msgpack formats a valid message uses (``fixmap``, ``uint64``, ``str32``...), read off its
bytes: the vectors list them, and a test checks that together they cover every format the
protocol uses."""

from __future__ import annotations

import struct

# first byte -> (format, bytes of length field, payload is the length (True) or fixed size)
_FIXED: dict[int, tuple[str, int]] = {
    0xC0: ("nil", 0),
    0xC2: ("false", 0),
    0xC3: ("true", 0),
    0xCA: ("float32", 4),
    0xCB: ("float64", 8),
    0xCC: ("uint8", 1),
    0xCD: ("uint16", 2),
    0xCE: ("uint32", 4),
    0xCF: ("uint64", 8),
    0xD0: ("int8", 1),
    0xD1: ("int16", 2),
    0xD2: ("int32", 4),
    0xD3: ("int64", 8),
}
_SIZED: dict[int, tuple[str, int]] = {
    0xC4: ("bin8", 1),
    0xC5: ("bin16", 2),
    0xC6: ("bin32", 4),
    0xD9: ("str8", 1),
    0xDA: ("str16", 2),
    0xDB: ("str32", 4),
}
_CONTAINERS: dict[int, tuple[str, int, int]] = {  # (format, length bytes, items per entry)
    0xDC: ("array16", 2, 1),
    0xDD: ("array32", 4, 1),
    0xDE: ("map16", 2, 2),
    0xDF: ("map32", 4, 2),
}
_UNSIGNED = {1: ">B", 2: ">H", 4: ">I"}


def formats(data: bytes) -> list[str]:
    """Sorted format names of every value in ``data`` (which must be valid msgpack)."""
    seen: set[str] = set()
    pos, pending = 0, 1
    while pending:
        pending -= 1
        name, pos, children = _one(data, pos)
        seen.add(name)
        pending += children
    return sorted(seen)


def _length(data: bytes, pos: int, size: int) -> tuple[int, int]:
    (n,) = struct.unpack_from(_UNSIGNED[size], data, pos)
    return n, pos + size


def _one(data: bytes, pos: int) -> tuple[str, int, int]:
    """(format, position after the header and any payload, number of child values)."""
    b = data[pos]
    pos += 1
    if b <= 0x7F:
        return "positive_fixint", pos, 0
    if b >= 0xE0:
        return "negative_fixint", pos, 0
    if 0x80 <= b <= 0x8F:
        return "fixmap", pos, 2 * (b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return "fixarray", pos, b & 0x0F
    if 0xA0 <= b <= 0xBF:
        return "fixstr", pos + (b & 0x1F), 0
    if b in _FIXED:
        name, size = _FIXED[b]
        return name, pos + size, 0
    if b in _SIZED:
        name, size = _SIZED[b]
        n, pos = _length(data, pos, size)
        return name, pos + n, 0
    if b in _CONTAINERS:
        name, size, per_entry = _CONTAINERS[b]
        n, pos = _length(data, pos, size)
        return name, pos, per_entry * n
    raise ValueError(f"format 0x{b:02x} is not one the protocol uses")

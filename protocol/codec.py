"""Bytes <-> frames. ``decode_*`` returns a frame or raises ``ProtocolError`` for the documented
decoding failures (PROTOCOL.md "Errors": ``bad_frame``, ``too_large``, ``invalid_params``); any
other exception is a bug in a reader and is let through.

Sizes are checked before unpacking, and msgpack runs with per-type length limits and a budget of
arrays and maps per frame, so a small frame cannot expand into a large object graph, and the work
a frame costs is bounded by the budget, not by how much it packs (PROTOCOL.md "Encoding").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from .constants import CLIENT_FRAME_TYPES, FrameType
from .errors import BadFrame, ProtocolError, TooLarge
from .fields import MAX_ID_CHARS
from .frames import CLIENT_FRAMES, SERVER_FRAMES, ClientFrame, ServerFrame
from .records import Frame


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    max_frame_bytes: int = 12 * 1024 * 1024
    max_str_len: int = 1024 * 1024
    max_bin_len: int = 12 * 1024 * 1024
    max_array_len: int = 256
    max_map_len: int = 64
    # arrays and maps in one frame, its own map included: a client frame needs at most four
    max_containers: int = 64
    # a ping's t comes back in the pong, so what it may hold is bounded (client frames only)
    max_ping_bytes: int = 4096


DEFAULT_LIMITS = DecodeLimits()
# msgpack's own nesting limit (its C unpacker's stack); PROTOCOL.md "Encoding" states it.
MAX_DEPTH = 1024
# Our own client reads server frames; token id lists and dashboards' session tables are longer.
SERVER_FRAME_LIMITS = DecodeLimits(max_array_len=100_000, max_map_len=1024, max_containers=1024)

F = TypeVar("F", bound=Frame)


def encode(frame: Frame) -> bytes:
    packed: bytes = msgpack.packb(frame.to_wire(), use_bin_type=True)
    return packed


def unpack_map(data: bytes, limits: DecodeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """One msgpack map from ``data``, with every limit applied; nothing may follow it."""
    if type(data) is not bytes:
        raise BadFrame("frames are binary messages")
    if len(data) > limits.max_frame_bytes:
        raise TooLarge(f"frame of {len(data)} bytes is over {limits.max_frame_bytes}")
    budget = _ContainerBudget(limits.max_containers)
    try:
        # unpackb reads ``data`` in place (an Unpacker would first copy it into a 1 MiB buffer)
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            object_hook=budget.map,
            list_hook=budget.array,
            ext_hook=_no_ext,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except ProtocolError:
        raise
    except msgpack.ExtraData:
        raise BadFrame("bytes after the frame's map") from None
    except (ValueError, msgpack.UnpackException, TypeError, OverflowError, RecursionError) as e:
        raise _unpack_failure(e) from None
    # The object_hook (_string_keys_only) hands back each map as the dict msgpack built.
    if not isinstance(value, dict):
        raise BadFrame("a frame must be a msgpack map")
    return value


# msgpack reports a per-type limit as "<n> exceeds max_<kind>_len(<limit>)" (C and pure Python).
_OVER_LIMIT = re.compile(r"(\d+) exceeds max_(str|bin|array|map|ext)_len\((\d+)\)")
_UNITS = {"str": "bytes", "bin": "bytes", "array": "items", "map": "entries"}


def _unpack_failure(error: Exception) -> ProtocolError:
    """PROTOCOL.md "Errors": over a length limit is too_large; anything else is bad_frame."""
    if isinstance(error, msgpack.OutOfData) or "incomplete input" in str(error):
        return BadFrame("truncated msgpack")
    if isinstance(error, UnicodeDecodeError):
        return BadFrame("a msgpack str is not valid UTF-8")
    if isinstance(error, msgpack.StackError | RecursionError):
        return BadFrame(f"nested deeper than {MAX_DEPTH} arrays and maps")
    text = str(error) if type(error) is ValueError else ""
    if "map key" in text:
        return BadFrame("map keys must be strings")
    over = _OVER_LIMIT.search(text)
    if over is None:
        return BadFrame(f"not valid msgpack ({type(error).__name__})")
    size, kind, limit = over.groups()
    if kind == "ext":
        return BadFrame("msgpack ext types are not part of the protocol")
    return TooLarge(f"a msgpack {kind} of {size} {_UNITS[kind]} is over the limit of {limit}")


class _ContainerBudget:
    """Counts arrays and maps as msgpack completes each one and stops the decoding at the first
    past ``limit``. Every other value sits in a container of bounded length, so what a refused
    frame costs is bounded by the budget, not by the millions of values it may pack."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def array(self, value: list[Any]) -> list[Any]:
        self._spend()
        return value

    def map(self, value: dict[Any, Any]) -> dict[str, Any]:
        self._spend()
        # PROTOCOL.md "Encoding": every map key, at any depth, is a str.
        if not all(type(k) is str for k in value):
            raise BadFrame("map keys must be strings")
        return value

    def _spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TooLarge(f"more than {self.limit} arrays and maps in one frame")


def _no_ext(code: int, data: bytes) -> Any:
    raise BadFrame("msgpack ext types are not part of the protocol")


def _frame_type(data: Mapping[str, Any]) -> FrameType:
    kind = data.get("type")
    if type(kind) is not str:
        raise BadFrame("missing or non-string 'type'")
    try:
        return FrameType(kind)
    except ValueError:
        raise BadFrame(f"unknown frame type {kind!r}") from None


def _with_id(data: Mapping[str, Any], build: Callable[[Mapping[str, Any]], F]) -> F:
    """Build the frame; a failure names the client frame's id when it had a usable one."""
    try:
        return build(data)
    except ProtocolError as e:
        frame_id = data.get("id")
        if e.id is None and type(frame_id) is str and 1 <= len(frame_id) <= MAX_ID_CHARS:
            e.id = frame_id
        raise
    # Anything else a reader raises is a bug in the reader, not the peer's fault: it surfaces
    # (the connection logs it and answers ``internal``), and the fuzz tests catch it.


def decode_client_frame(data: bytes, limits: DecodeLimits = DEFAULT_LIMITS) -> ClientFrame:
    """What the server reads."""
    value = unpack_map(data, limits)
    kind = _frame_type(value)
    if kind not in CLIENT_FRAME_TYPES:
        raise BadFrame(f"{kind.value!r} is not a client frame")
    if kind is FrameType.PING and len(data) > limits.max_ping_bytes:
        raise TooLarge(f"a ping of {len(data)} bytes is over {limits.max_ping_bytes}")
    build: Callable[[Mapping[str, Any]], ClientFrame] = CLIENT_FRAMES[kind].from_wire
    return _with_id(value, build)


def decode_server_frame(data: bytes, limits: DecodeLimits = SERVER_FRAME_LIMITS) -> ServerFrame:
    """What a client reads."""
    value = unpack_map(data, limits)
    kind = _frame_type(value)
    if kind in CLIENT_FRAME_TYPES:
        raise BadFrame(f"{kind.value!r} is not a server frame")
    build: Callable[[Mapping[str, Any]], ServerFrame] = SERVER_FRAMES[kind].from_wire
    return _with_id(value, build)

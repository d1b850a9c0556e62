"""Truncated, mutated and hostile bytes give ``ProtocolError`` only, with bounded memory
(protocol/codec.py; PROTOCOL.md "Encoding")."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from wschat.protocol import (
    BadFrame,
    DecodeLimits,
    ErrorCode,
    Ping,
    Prompt,
    ProtocolError,
    TooLarge,
    decode_client_frame,
    decode_server_frame,
    encode,
)
from wschat.protocol.codec import MAX_DEPTH

from .test_frames import CLIENT_SAMPLES, SERVER_SAMPLES

PING_T = b"\x82\xa4type\xa4ping\xa1t"  # a ping map whose t value follows
MiB = 1024 * 1024


def code_of(decode: Callable[[bytes], Any], data: Any) -> ErrorCode | None:
    """The error code decoding raises, or None when it gives a frame; any other exception fails."""
    try:
        decode(data)
    except ProtocolError as e:
        return e.code
    return None


def peak_bytes(action: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        action()
    except ProtocolError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


SAMPLES = [(decode_client_frame, f) for f in CLIENT_SAMPLES] + [
    (decode_server_frame, f) for f in SERVER_SAMPLES
]


@pytest.mark.parametrize(("decode", "frame"), SAMPLES, ids=lambda v: getattr(v, "TYPE", ""))
def test_every_truncation_of_a_frame_is_bad_frame(decode: Any, frame: Any) -> None:
    data = encode(frame)
    assert {code_of(decode, data[:cut]) for cut in range(len(data))} == {ErrorCode.BAD_FRAME}


@pytest.mark.parametrize(("decode", "frame"), SAMPLES, ids=lambda v: getattr(v, "TYPE", ""))
def test_every_one_byte_mutation_gives_a_frame_or_protocol_error(decode: Any, frame: Any) -> None:
    data = encode(frame)
    for pos in range(len(data)):
        for byte in {0x00, 0xFF, 0xC1, 0xC0, 0xDD, 0xDF, 0xDB, data[pos] ^ 0x01, data[pos] ^ 0x80}:
            code_of(decode, data[:pos] + bytes([byte]) + data[pos + 1 :])


def test_trailing_bytes_are_bad_frame() -> None:
    with pytest.raises(BadFrame, match="bytes after the frame's map"):
        decode_client_frame(encode(Ping()) + b"\xc0")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xdf" + struct.pack(">I", 1_000_000), ErrorCode.TOO_LARGE),
        (b"\xde\xff\xff", ErrorCode.TOO_LARGE),
        (PING_T + b"\xdd\xff\xff\xff\xff", ErrorCode.TOO_LARGE),
        (PING_T + b"\xdc\xff\xff", ErrorCode.TOO_LARGE),
        (PING_T + b"\xdb\xff\xff\xff\xff", ErrorCode.BAD_FRAME),  # truncated before the limit
        (PING_T + b"\xc6\xff\xff\xff\xff", ErrorCode.BAD_FRAME),
        (PING_T + b"\xc6\x00\x00\x00\x10" + b"x" * 16, None),
    ],
    ids=["map32", "map16", "array32", "array16", "str32", "bin32", "bin32-small"],
)
def test_huge_declared_lengths_are_refused_without_allocating(data: bytes, code: Any) -> None:
    assert code_of(decode_client_frame, data) == code
    assert peak_bytes(lambda: decode_client_frame(data)) < MiB


def test_a_million_entry_map_present_in_full_is_too_large_in_bounded_memory() -> None:
    entries = b"".join(msgpack.packb(f"k{i}") + b"\xc0" for i in range(1_000_000))
    data = b"\xdf" + struct.pack(">I", 1_000_001) + b"\xa4type\xa4ping" + entries
    limits = DecodeLimits(max_frame_bytes=len(data))
    with pytest.raises(TooLarge, match="map of 1000001 entries is over the limit of 64"):
        decode_client_frame(data, limits)
    assert peak_bytes(lambda: decode_client_frame(data, limits)) < 2 * len(data)


@pytest.mark.parametrize(("depth", "code"), [(1024, None), (1025, ErrorCode.BAD_FRAME)])
def test_nesting_is_refused_past_1024_containers(depth: int, code: Any) -> None:
    data = PING_T + b"\x91" * (depth - 2) + b"\x90"  # the ping's map + depth-1 arrays
    limits = DecodeLimits(max_containers=MAX_DEPTH, max_ping_bytes=len(data))
    assert code_of(lambda d: decode_client_frame(d, limits), data) == code


def test_nesting_past_1024_is_bad_frame_even_within_a_larger_container_budget() -> None:
    data = PING_T + b"\x91" * 1023 + b"\x90"  # checked on the way in, before any count
    assert code_of(decode_client_frame, data) == ErrorCode.BAD_FRAME


@pytest.mark.parametrize(("containers", "code"), [(64, None), (65, ErrorCode.TOO_LARGE)])
def test_more_arrays_and_maps_than_the_budget_is_too_large(containers: int, code: Any) -> None:
    data = PING_T + b"\xdc\x00\x3f" + b"\x90" * 62 + b"\xc0"  # the map, t and 62 arrays in t
    if containers == 65:
        data = data[:-1] + b"\x90"
    assert code_of(decode_client_frame, data) == code


def tree(levels: int) -> bytes:
    """A ping whose t is a tree of arrays, 16 to a level, over arrays of 10 small ints."""
    node = b"\x9a" + b"\x00" * 10
    for _ in range(levels):
        node = b"\xdc\x00\x10" + node * 16
    return PING_T + node


def test_a_frame_packing_a_million_values_is_refused_having_built_few_of_them() -> None:
    data = tree(4)  # 734 kB: 69,905 arrays holding 655,360 ints
    limits = DecodeLimits(max_array_len=16, max_ping_bytes=len(data))
    with pytest.raises(TooLarge, match="more than 64 arrays and maps in one frame"):
        decode_client_frame(data, limits)
    everything = DecodeLimits(max_containers=70_000, max_ping_bytes=len(data))
    assert peak_bytes(lambda: decode_client_frame(data, everything)) > 5 * MiB
    assert peak_bytes(lambda: decode_client_frame(data, limits)) < 64 * 1024


def test_a_ping_over_max_ping_bytes_is_too_large_as_it_would_be_echoed() -> None:
    data = encode(Ping("x" * 100))
    assert decode_client_frame(data, DecodeLimits(max_ping_bytes=len(data))).t == "x" * 100
    with pytest.raises(TooLarge) as raised:
        decode_client_frame(data, DecodeLimits(max_ping_bytes=len(data) - 1))
    assert raised.value.message == f"a ping of {len(data)} bytes is over {len(data) - 1}"
    big_prompt = encode(Prompt("p", "x" * 10_000))  # the cap is for pings alone
    assert decode_client_frame(big_prompt).text == "x" * 10_000


def test_very_deep_nesting_is_bad_frame_not_recursion_error() -> None:
    with pytest.raises(BadFrame, match="nested deeper than 1024"):
        decode_client_frame(PING_T + b"\x91" * 100_000 + b"\xc0")


@pytest.mark.parametrize(
    "ext",
    [
        b"\xd4\x05\x00",
        b"\xd5\x05\x00\x00",
        b"\xd6\xff\x00\x00\x00\x00",
        b"\xd7\xff" + b"\x00" * 8,
        b"\xd8\x05" + b"\x00" * 16,
        b"\xc7\x00\x05",
        b"\xc7\x01\x05\x00",
        b"\xc8\x00\x01\x05\x00",
        b"\xc9\x00\x00\x00\x01\x05\x00",
        b"\xc9\xff\xff\xff\xff\x05",
    ],
)
def test_ext_types_are_bad_frame(ext: bytes) -> None:
    assert code_of(decode_client_frame, PING_T + ext) == ErrorCode.BAD_FRAME


@pytest.mark.parametrize(
    "key",
    [
        b"\x01",
        b"\xc0",
        b"\xc3",
        b"\xcb" + struct.pack(">d", 1.0),
        b"\xc4\x01k",
        b"\x91\x01",
        b"\x80",
    ],
    ids=["int", "nil", "bool", "float", "bin", "array", "map"],
)
@pytest.mark.parametrize("nested", [False, True])
def test_non_string_keys_are_bad_frame_at_any_depth(key: bytes, nested: bool) -> None:
    data = PING_T + b"\x81" + key + b"\xc0" if nested else b"\x82\xa4type\xa4ping" + key + b"\xc0"
    with pytest.raises(BadFrame):
        decode_client_frame(data)


def test_frame_over_max_frame_bytes_is_too_large_before_unpacking() -> None:
    data = b"\xc1" * 101  # not msgpack at all: the size check must come first
    with pytest.raises(TooLarge, match="frame of 101 bytes is over 100"):
        decode_client_frame(data, DecodeLimits(max_frame_bytes=100))


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (Prompt("p", "x" * 11), "a msgpack str of 11 bytes is over the limit of 10"),
        (Ping(b"x" * 11), "a msgpack bin of 11 bytes is over the limit of 10"),
        (Ping(list(range(11))), "a msgpack array of 11 items is over the limit of 10"),
        (
            Ping({str(i): i for i in range(11)}),
            "a msgpack map of 11 entries is over the limit of 10",
        ),
    ],
    ids=["str", "bin", "array", "map"],
)
def test_value_over_a_per_type_limit_is_too_large(frame: Any, message: str) -> None:
    limits = DecodeLimits(max_str_len=10, max_bin_len=10, max_array_len=10, max_map_len=10)
    with pytest.raises(TooLarge) as raised:
        decode_client_frame(encode(frame), limits)
    assert raised.value.message == message


@pytest.mark.parametrize("data", [bytearray(b"\x80"), memoryview(b"\x80"), "\x80", None, 1])
def test_anything_but_bytes_is_bad_frame(data: Any) -> None:
    with pytest.raises(BadFrame, match="frames are binary messages"):
        decode_client_frame(data)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x81\xa4type\xa2\xff\xfe", "a msgpack str is not valid UTF-8"),
        (b"\x81\xa4type\xa3\xed\xa0\x80", "a msgpack str is not valid UTF-8"),
        (b"\x81\xa4type\xa2\xc0\x80", "a msgpack str is not valid UTF-8"),
        (b"\xc1", "not valid msgpack (FormatError)"),
    ],
    ids=["0xff", "surrogate", "overlong", "reserved"],
)
def test_invalid_utf8_and_reserved_bytes_are_bad_frame(raw: bytes, message: str) -> None:
    with pytest.raises(BadFrame) as raised:
        decode_client_frame(raw)
    assert raised.value.message == message


def test_an_error_names_the_frame_id_only_when_the_id_itself_is_valid() -> None:
    bad_params = {"type": "prompt", "id": "p7", "text": "x", "params": {"top_k": -1}}
    with pytest.raises(ProtocolError) as raised:
        decode_client_frame(msgpack.packb(bad_params))
    assert (raised.value.code, raised.value.id) == (ErrorCode.INVALID_PARAMS, "p7")
    with pytest.raises(ProtocolError) as raised:
        decode_client_frame(msgpack.packb({**bad_params, "id": "x" * 65}))
    assert (raised.value.code, raised.value.id) == (ErrorCode.BAD_FRAME, None)


def test_server_decoder_refuses_client_frames_and_client_decoder_server_frames() -> None:
    with pytest.raises(BadFrame, match="'ping' is not a server frame"):
        decode_server_frame(encode(Ping()))
    with pytest.raises(BadFrame, match="'queued' is not a client frame"):
        decode_client_frame(msgpack.packb({"type": "queued", "id": "p", "position": 1}))

"""Fuzzing the decoders: whatever the bytes, the result is a frame or ``ProtocolError``
(PROTOCOL.md "Encoding"; STYLE.md 2)."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from wschat.protocol import (
    DecodeLimits,
    Frame,
    ProtocolError,
    decode_client_frame,
    decode_server_frame,
    encode,
)

from .test_frames import CLIENT_SAMPLES, SERVER_SAMPLES, client_frames, server_frames

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = DecodeLimits(max_frame_bytes=4096, max_str_len=64, max_bin_len=64, max_array_len=8)
DECODERS = (decode_client_frame, decode_server_frame)


def frame_or_protocol_error(data: bytes) -> None:
    for decode in DECODERS:
        for limits in ((), (SMALL,)):
            try:
                frame = decode(data, *limits)
            except ProtocolError as e:
                assert e.code.value and isinstance(e.message, str)
            else:
                assert isinstance(frame, Frame)
                encode(frame)  # a decoded frame can always be sent on


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[Frame]) -> bytes:
    """A valid encoding with bytes replaced, inserted, deleted, or cut off."""
    data = bytearray(encode(draw(frames)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        action = draw(st.sampled_from(["replace", "insert", "delete", "cut"]))
        byte = draw(st.integers(0, 255))
        if action == "replace" and data:
            data[pos] = byte
        elif action == "insert":
            data.insert(pos, byte)
        elif action == "delete" and data:
            del data[pos]
        else:
            del data[pos:]
    return bytes(data)


every_sample = st.sampled_from(CLIENT_SAMPLES + SERVER_SAMPLES)


@FUZZ
@given(st.binary(max_size=512))
@example(b"")
@example(b"\x81\xa4type\xa6prompt")
def test_arbitrary_bytes_give_a_frame_or_protocol_error(data: bytes) -> None:
    frame_or_protocol_error(data)


@FUZZ
@given(mutated(every_sample | client_frames | server_frames))
def test_mutated_frames_give_a_frame_or_protocol_error(data: bytes) -> None:
    frame_or_protocol_error(data)


# Maps shaped like frames (a real type, fields of arbitrary msgpack values) reach the field checks.
wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=80)
    | st.binary(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=10,
)
field_names = st.sampled_from(
    [
        "id",
        "text",
        "images",
        "params",
        "data",
        "mime",
        "t",
        "system",
        "index",
        "ids",
        "reason",
        "usage",
        "timing",
        "code",
        "message",
        "position",
        "limits",
        "capabilities",
        "v",
        "in_ms",
    ]
)
param_names = st.sampled_from(
    [
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "stop",
        "seed",
        "token_ids",
        "bogus",
    ]
)
frame_types = st.sampled_from(
    [s.TYPE.value for s in CLIENT_SAMPLES + SERVER_SAMPLES] + ["nope", ""]
)


@st.composite
def frame_shaped(draw: st.DrawFn) -> bytes:
    value: dict[str, Any] = {"type": draw(frame_types)}
    value.update(draw(st.dictionaries(field_names, wire_values, max_size=6)))
    if draw(st.booleans()):
        value["params"] = draw(st.dictionaries(param_names, wire_values, max_size=4))
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


@FUZZ
@given(frame_shaped())
def test_frame_shaped_maps_give_a_frame_or_protocol_error(data: bytes) -> None:
    frame_or_protocol_error(data)

"""How a record's fields go to the wire: order, unset optionals, nil against absent
(protocol/records.py)."""

from __future__ import annotations

import msgpack
from wschat.protocol import (
    ABSENT,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    Ping,
    Pong,
    Prompt,
    Stats,
    Timing,
    Usage,
    decode_client_frame,
    encode,
)


def test_type_comes_first_and_unset_optionals_are_left_out() -> None:
    wire = msgpack.unpackb(encode(Prompt("p", "hi")))
    assert list(wire) == ["type", "id", "text"]
    assert msgpack.unpackb(encode(Error(ErrorCode.BUSY, "m"))) == {
        "type": "error",
        "code": "busy",
        "message": "m",
    }


def test_ping_t_absent_and_nil_are_different_frames() -> None:
    assert msgpack.unpackb(encode(Pong())) == {"type": "pong"}
    assert msgpack.unpackb(encode(Pong(None))) == {"type": "pong", "t": None}
    assert decode_client_frame(encode(Ping())).t is ABSENT
    assert decode_client_frame(encode(Ping(None))).t is None


def test_nil_ttft_turn_and_percentiles_are_sent_as_nil() -> None:
    done = Done("p", FinishReason.CANCELLED, "", Usage(0, 0, 0), Timing(1.0, None, 0.0, 1.0))
    assert msgpack.unpackb(encode(done))["timing"]["ttft_ms"] is None
    assert msgpack.unpackb(encode(done))["turn"] is None  # not kept: nil, not absent
    stats = Stats(1, 2, 3, 4.5, None, 6.0, 7, {"busy": 1}, None, "m", "cpu", 8.0)
    wire = msgpack.unpackb(encode(stats))
    assert wire["ttft_p50_ms"] is None and wire["kv_tokens"] is None

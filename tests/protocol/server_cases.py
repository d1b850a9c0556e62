"""The server-frame cases of ``protocol/vectors/``: what a client decoder must accept or refuse."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from wschat.protocol import (
    Capabilities,
    Configured,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    GoAway,
    ImageOk,
    Limits,
    Pong,
    Queued,
    Ready,
    ResetOk,
    Resumed,
    Rewound,
    Start,
    Stats,
    Timing,
    Token,
    TokenLogprobs,
    ToolCall,
    Usage,
    encode,
)

from .vector_cases import Case, pack

BAD = ErrorCode.BAD_FRAME.value


def server_frames() -> Iterator[Case]:
    def server(name: str, description: str, frame: Any) -> Case:
        return Case(name, description, encode(frame), direction="server")

    limits = Limits(12582912, 10485760, 8192, 1024, 25000000, 4, 262144, 8192, 50, 600.0)
    yield server(
        "ready_full",
        "ready with every limit our server reports, the engine and the prompt format",
        Ready(
            1,
            "3f2a9c01d4e5b6a7",
            "resume-token",
            "gemma-3-270m",
            Capabilities(True, 4),
            limits,
            "batched",
            "transcript",
        ),
    )
    yield server(
        "ready_minimal",
        "ready with only the fields the shared spec requires",
        Ready(1, "s", "r", "m", Capabilities(False, 0), Limits(1048576, 0, 2048, 256, 0)),
    )
    minimal_limits = Limits(1048576, 0, 2048, 256, 0)
    yield server(
        "ready_resumed",
        "ready of a resumed session whose reply p4 follows (PROTOCOL.md section 10)",
        Ready(
            1, "s", "r", "m", Capabilities(False, 0), minimal_limits, resumed=Resumed("p3", "p4")
        ),
    )
    yield server(
        "ready_resumed_turns",
        "ready of a resumed session holding 3 exchanges, the last p3's, no reply following",
        Ready(
            1, "s", "r", "m", Capabilities(False, 0), minimal_limits, resumed=Resumed("p3", None, 3)
        ),
    )
    yield server(
        "ready_resumed_nil",
        "ready of a resumed session with no exchange yet and no reply: both fields nil",
        Ready(1, "s", "r", "m", Capabilities(False, 0), minimal_limits, resumed=Resumed()),
    )
    yield server("configured", "configured", Configured())
    yield server("image_ok", "image_ok", ImageOk("i1", 640, 480))
    yield server("reset_ok", "reset_ok", ResetOk())
    yield server("rewound", "rewound: 2 exchanges held", Rewound(2))
    yield server("pong_t", "pong echoing t", Pong([1, "x", {"k": b"\x00"}]))
    yield server("pong_no_t", "pong for a ping without t", Pong())
    yield server("pong_t_nil", "pong for a ping with t: nil", Pong(None))
    yield server("queued", "queued at place 2", Queued("p1", 2))
    yield server("start", "start", Start("p1", 37, 12, 0.25))
    yield server("token", "a token", Token("p1", "Hel", 1))
    yield server(
        "tool_call",
        "a whole call the reply makes, its arguments as JSON text",
        ToolCall("p1", 0, "call_x0", "get_weather", '{"city": "Paris"}'),
    )
    yield server(
        "token_ids", "a merged token frame with ids (index jumped)", Token("p1", "lo!", 3, (1, 2))
    )
    yield server(
        "token_logprobs",
        "a token frame of two tokens, each with its logprob and 2 alternatives",
        Token(
            "p1",
            " red",
            5,
            logprobs=TokenLogprobs(
                (2063, 3004),
                (" r", "ed"),
                (b" r", b"ed"),
                (-0.25, -0.015625),
                2,
                (2063, 674, 3004, 1200),
                (" r", " b", "ed", "ose"),
                (b" r", b" b", b"ed", b"ose"),
                (-0.25, -1.5, -0.015625, -4.0),
            ),
        ),
    )
    yield server(
        "token_4_byte_utf8",
        "a token holding a whole 4-byte character",
        Token("p1", "\U0001f600", 4),
    )
    usage, timing = Usage(37, 8, 12), Timing(0.3, 45.5, 28.25, 320.0)
    yield server(
        "done_stop",
        "done, reason stop: the reply is exchange 3",
        Done("p1", FinishReason.STOP, "Hello!", usage, timing, 3),
    )
    old_done = Done("p1", FinishReason.STOP, "Hi", usage, timing).to_wire()
    del old_done["turn"]
    yield Case(
        "done_without_turn",
        "done from a server older than rewind: no turn",
        pack(old_done),
        direction="server",
    )
    yield server(
        "done_length",
        "done, reason length: the reply is exchange 1",
        Done("p1", FinishReason.LENGTH, "Hi", usage, timing, 1),
    )
    yield server(
        "done_tool_calls",
        "done, reason tool_calls: the reply is its tool_call frames, its text empty",
        Done("p1", FinishReason.TOOL_CALLS, "", usage, timing, 2),
    )
    yield server(
        "done_cancelled_while_queued",
        "done for a prompt cancelled in the queue: no tokens, ttft_ms nil, turn nil (not kept)",
        Done("p2", FinishReason.CANCELLED, "", Usage(0, 0, 0), Timing(12.0, None, 0.0, 12.0)),
    )
    yield server(
        "done_error",
        "done, reason error: turn nil (not kept)",
        Done("p3", FinishReason.ERROR, "He", usage, timing),
    )
    for code in ErrorCode:
        yield server(
            f"error_{code.value}", f"error code {code.value}", Error(code, "message", "p1")
        )
    yield server(
        "error_without_id",
        "an error caused by no frame with an id",
        Error(ErrorCode.BAD_FRAME, "truncated msgpack"),
    )
    yield server("goaway", "goaway", GoAway(10000))
    yield server(
        "stats",
        "a /v1/stats snapshot",
        Stats(
            sessions=3,
            running=1,
            queued=1,
            tokens_per_s=24.5,
            ttft_p50_ms=80.0,
            ttft_p95_ms=140.5,
            cancellations=2,
            errors={"busy": 1, "bad_frame": 4},
            kv_tokens=5120,
            model="gemma-3-270m",
            device="cpu",
            uptime_s=3600.5,
            live=({"id": "5d41402abc", "state": "running", "tokens": 17, "turns": 2},),
        ),
    )
    yield server(
        "stats_empty",
        "a stats snapshot before any generation: nil percentiles and KV size",
        Stats(0, 0, 0, 0.0, None, None, 0, {}, None, "m", "cpu", 0.5),
    )


def server_layer() -> Iterator[Case]:
    """Server frames a client must refuse."""

    def server(name: str, description: str, value: Any) -> Case:
        return Case(name, description, pack(value), direction="server", expect=BAD)

    yield server(
        "client_type_from_server",
        "a client frame type sent by a server",
        {"type": "prompt", "id": "a", "text": "x"},
    )
    yield server(
        "token_index_float",
        "index 1.0: an int field",
        {"type": "token", "id": "a", "text": "x", "index": 1.0},
    )
    yield server(
        "token_index_bool", "index true", {"type": "token", "id": "a", "text": "x", "index": True}
    )
    yield server("rewound_missing_turns", "rewound without turns", {"type": "rewound"})
    done = Done("a", FinishReason.STOP, "", Usage(1, 0, 0), Timing(0.0, None, 0.0, 0.0))
    yield server("done_turn_float", "turn 1.0: an int field", {**done.to_wire(), "turn": 1.0})
    yield server(
        "error_unknown_code",
        "an error code outside the table",
        {"type": "error", "code": "oops", "message": "m"},
    )
    yield server(
        "start_queued_ms_nan",
        "queued_ms NaN",
        {
            "type": "start",
            "id": "a",
            "prompt_tokens": 1,
            "cached_tokens": 0,
            "queued_ms": float("nan"),
        },
    )
    yield server("goaway_missing_in_ms", "goaway without in_ms", {"type": "goaway"})
    yield server(
        "done_unknown_reason",
        "a finish reason outside the table",
        {
            "type": "done",
            "id": "a",
            "reason": "timeout",
            "text": "",
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0},
            "timing": {
                "queued_ms": 0.0,
                "ttft_ms": None,
                "decode_tokens_per_s": 0.0,
                "total_ms": 0.0,
            },
        },
    )

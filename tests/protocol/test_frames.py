"""Every frame type survives encode -> decode_* unchanged (protocol/frames.py, codec.py)."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wschat.protocol import (
    BadFrame,
    Cancel,
    Capabilities,
    Configure,
    Configured,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    Frame,
    FrameType,
    GenerationParams,
    GoAway,
    Image,
    ImageOk,
    Limits,
    Ping,
    Pong,
    Prompt,
    Queued,
    Ready,
    Regenerate,
    Reset,
    ResetOk,
    Resumed,
    Rewind,
    Rewound,
    Start,
    Stats,
    Timing,
    Token,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolResults,
    ToolSpec,
    Usage,
    decode_client_frame,
    decode_server_frame,
    encode,
)
from wschat.protocol.constants import CLIENT_FRAME_TYPES

FULL_PARAMS = GenerationParams(
    max_new_tokens=5,
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    repetition_penalty=1.5,
    stop=("a", "\U0001f600"),
    seed=-(2**63),
    token_ids=True,
)
TOOL_PARAMS = GenerationParams(
    tools=(
        ToolSpec("get_weather", "The weather in a city", {"type": "object", "required": ["city"]}),
        ToolSpec("now"),
    ),
    tool_choice=ToolChoice("named", "now"),
    parallel_tool_calls=False,
)
LIMITS = Limits(1, 2, 3, 4, 5, 6, 7, 8, 9, 0.5)

CLIENT_SAMPLES: list[Frame] = [
    Prompt("p", "hi"),
    Prompt("\U0001f600" * 64, "", (b"\x89PNG", b""), FULL_PARAMS),
    Prompt("p", "x", params=GenerationParams()),
    Image("i", b"\x00" * 300, "image/webp"),
    Image("i", b""),
    Cancel(),
    Cancel("p"),
    Reset(),
    Ping(),
    Ping(None),
    Ping({"nested": [1, -1.5, b"\x00", None, True, "s"]}),
    Configure(),
    Configure("", FULL_PARAMS),
    Rewind(0),
    Rewind(2**64 - 1),
    Regenerate("r"),
    Regenerate("r", FULL_PARAMS),
    ToolResults("t", (ToolResult("call_1", "sunny"), ToolResult("call_2", '{"c": 21}'))),
    ToolResults("t", (ToolResult("c", ""),), TOOL_PARAMS),
]
# the dashboard's last minutes (PROTOCOL.md "stats" ``history``): TTFT unknown where nil
HISTORY: dict[str, tuple[float | None, ...]] = {
    "tokens_per_s": (1.0, 2.5),
    "running": (0.0, 1.0),
    "queued": (0.0, 0.0),
    "sessions": (1.0, 2.0),
    "ttft_p50_ms": (None, 30.0),
    "ttft_p95_ms": (None, 41.5),
}
SERVER_SAMPLES: list[Frame] = [
    Ready(1, "s", "r", "m", Capabilities(True, 4), LIMITS, "generate"),
    Ready(1, "s", "r", "m", Capabilities(False, 0), Limits(1, 2, 3, 4, 5)),
    Ready(1, "s", "r", "m", Capabilities(False, 0), LIMITS, resumed=Resumed("p", None, 2)),
    Configured(),
    ImageOk("i", 1, 2),
    ResetOk(),
    Rewound(0),
    Pong(),
    Pong(None),
    Pong([1, 2**64 - 1]),
    Queued("p", 1),
    Start("p", 10, 0, 0.0),
    Token("p", "\U0001f600", 1),
    Token("p", "ab", 3, (7, 8)),
    ToolCall("p", 0, "call_1", "get_weather", '{"city": "Paris"}'),
    *(
        Done("p", reason, "ab", Usage(1, 2, 3), Timing(0.5, None if i else 1.5, 2.0, 3.0))
        for i, reason in enumerate(FinishReason)
    ),
    Done("p", FinishReason.STOP, "", Usage(1, 0, 0), Timing(0.0, None, 0.0, 0.0), 7),
    *(Error(code, "m", "p") for code in ErrorCode),
    Error(ErrorCode.BAD_FRAME, "m"),
    GoAway(0),
    Stats(0, 0, 0, 0.0, None, None, 0, {}, None, "m", "cpu", 0.0, rewinds=2, regenerates=1),
    Stats(1, 2, 3, 4.5, None, 6.0, 7, {"busy": 1}, None, "m", "cpu", 8.0, ({"session": "x"},)),
    Stats(0, 0, 0, 0.0, 1.0, 2.0, 0, {}, 12, "m", "cuda:0", 0.0),
    Stats(0, 0, 0, 0.0, None, None, 0, {}, None, "m", "cpu", 0.0, history=HISTORY),
]


def stats_with_history(history: object) -> bytes:
    stats = msgpack.unpackb(encode(SERVER_SAMPLES[-1]))
    packed: bytes = msgpack.packb({**stats, "history": history})
    return packed


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ([1.0], "history must be a map"),
        (
            {k: v for k, v in HISTORY.items() if k != "queued"},
            "history.queued must be a list",
        ),
        ({**HISTORY, "running": "0, 1"}, "history.running must be a list"),
        ({**HISTORY, "sessions": [1.0]}, "history's lists must be of one length"),
        ({**HISTORY, "tokens_per_s": ["1", 2.0]}, "history.tokens_per_s must be a finite number"),
    ],
)
def test_a_stats_history_that_breaks_its_shape_is_a_bad_frame(
    history: object, message: str
) -> None:
    with pytest.raises(BadFrame) as raised:
        decode_server_frame(stats_with_history(history))
    assert raised.value.message == message


def test_a_stats_history_keeps_its_series_and_leaves_out_others() -> None:
    stats = decode_server_frame(stats_with_history({**HISTORY, "kv_tokens": [1, 2]}))
    assert isinstance(stats, Stats) and stats.history == HISTORY


def test_samples_cover_every_frame_type() -> None:
    kinds = {type(f).TYPE for f in CLIENT_SAMPLES + SERVER_SAMPLES}
    assert kinds == set(FrameType)
    assert {type(f).TYPE for f in CLIENT_SAMPLES} == CLIENT_FRAME_TYPES


@pytest.mark.parametrize("frame", CLIENT_SAMPLES, ids=repr)
def test_client_frame_round_trips(frame: Frame) -> None:
    assert decode_client_frame(encode(frame)) == frame


@pytest.mark.parametrize("frame", SERVER_SAMPLES, ids=repr)
def test_server_frame_round_trips(frame: Frame) -> None:
    assert decode_server_frame(encode(frame)) == frame


def test_float_fields_are_sent_as_float64_even_when_whole() -> None:
    assert encode(Start("p", 1, 0, 2.0)).endswith(b"\xcb" + struct.pack(">d", 2.0))


def test_int_given_for_a_float_field_decodes_as_float() -> None:
    raw = msgpack.packb(
        {"type": "start", "id": "p", "prompt_tokens": 1, "cached_tokens": 0, "queued_ms": 3}
    )
    start = decode_server_frame(raw)
    assert isinstance(start, Start) and type(start.queued_ms) is float and start.queued_ms == 3.0


# -- generated frames --------------------------------------------------------------------------

ids = st.text(min_size=1, max_size=64)
finite = st.floats(allow_nan=False, allow_infinity=False)
u64 = st.integers(0, 2**63 - 1)
params = st.builds(
    GenerationParams,
    max_new_tokens=st.none() | st.integers(1, 10_000),
    temperature=st.none() | st.floats(0, 2),
    top_p=st.none() | st.floats(0, 1, exclude_min=True),
    top_k=st.none() | st.integers(0, 1000),
    min_p=st.none() | st.floats(0, 1),
    repetition_penalty=st.none() | st.floats(0, 2, exclude_min=True),
    stop=st.none() | st.lists(st.text(min_size=1, max_size=64), max_size=4).map(tuple),
    seed=st.none() | st.integers(-(2**63), 2**64 - 1),
    token_ids=st.none() | st.booleans(),
)
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | finite | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
client_frames = st.one_of(
    st.builds(
        Prompt,
        ids,
        st.text(),
        st.lists(st.binary(max_size=64), max_size=4).map(tuple),
        st.none() | params,
    ),
    st.builds(Image, ids, st.binary(max_size=256), st.none() | st.text()),
    st.builds(Cancel, st.none() | ids),
    st.just(Reset()),
    st.builds(Ping, plain),
    st.builds(Configure, st.none() | st.text(), st.none() | params),
    st.builds(Rewind, u64),
    st.builds(Regenerate, ids, st.none() | params),
    st.builds(
        ToolResults,
        ids,
        st.lists(
            st.builds(ToolResult, ids, st.text()),
            min_size=1,
            max_size=4,
            unique_by=lambda r: r.call_id,
        ).map(tuple),
        st.none() | params,
    ),
)
server_frames = st.one_of(
    st.builds(Queued, ids, u64),
    st.builds(Start, ids, u64, u64, finite),
    st.builds(Token, ids, st.text(min_size=1), u64, st.none() | st.lists(u64).map(tuple)),
    st.builds(ToolCall, ids, u64, ids, st.text(), st.text()),
    st.builds(
        Done,
        ids,
        st.sampled_from(FinishReason),
        st.text(),
        st.builds(Usage, u64, u64, u64),
        st.builds(Timing, finite, st.none() | finite, finite, finite),
        st.none() | u64,
    ),
    st.builds(Error, st.sampled_from(ErrorCode), st.text(), st.none() | ids),
    st.builds(ImageOk, ids, u64, u64),
    st.builds(GoAway, u64),
    st.builds(Rewound, u64),
    st.builds(Pong, plain),
)


@settings(max_examples=200, deadline=None)
@given(client_frames)
def test_generated_client_frames_round_trip(frame: Frame) -> None:
    decoded = decode_client_frame(encode(frame))
    assert decoded == frame and encode(decoded) == encode(frame)


@settings(max_examples=200, deadline=None)
@given(server_frames)
def test_generated_server_frames_round_trip(frame: Frame) -> None:
    decoded = decode_server_frame(encode(frame))
    assert decoded == frame and encode(decoded) == encode(frame)

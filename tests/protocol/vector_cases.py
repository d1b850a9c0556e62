"""The cases of ``protocol/vectors/``: bytes, the decoder they are for, and the expected result.

``make_vectors`` checks each expectation against the Python codec before it writes anything, so
a case here is a claim about ``protocol``, not a recording of whatever it happens to do.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
from wschat.protocol import (
    DEFAULT_LIMITS,
    Cancel,
    Configure,
    GenerationParams,
    Image,
    Ping,
    Prompt,
    Regenerate,
    Reset,
    Rewind,
    ToolResult,
    ToolResults,
    encode,
)

OK = "ok"
# A real 1x1 PNG (one orange pixel), spelled out so the vectors do not depend on zlib's output.
PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415478da63f8"
    "dfc0000004010180fbd7cbf10000000049454e44ae426082"
)


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    data: bytes
    direction: str = "client"  # which decoder: decode_client_frame or decode_server_frame
    expect: str = OK  # OK, or the error code decoding must raise
    canonical: bool = True  # re-encoding the plain msgpack value gives these bytes exactly


def pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def ping(t: Any) -> bytes:
    return encode(Ping(t))


def ping_of_bytes(size: int) -> bytes:
    """A ping whose t is a str that makes the whole message ``size`` bytes (str16 sizes)."""
    data = ping(_str_of_bytes(size - len(ping(_str_of_bytes(256))) + 256))
    assert len(data) == size
    return data


def _pattern(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def _str_of_bytes(size: int) -> str:
    return ("abcdefghijklmnopqrstuvwxyz0123456789" * (size // 36 + 1))[:size]


def _raw_ping(t: bytes) -> bytes:
    """A ping whose ``t`` is the given raw msgpack bytes (for encodings packb never makes)."""
    return b"\x82\xa4type\xa4ping\xa1t" + t


def _prompt_with(params: Any, **extra: Any) -> bytes:
    return pack({"type": "prompt", "id": "p", "text": "x", "params": params, **extra})


def client_frames() -> Iterator[Case]:
    yield Case("prompt_minimal", "a prompt with id and text only", encode(Prompt("p1", "Hello")))
    params = GenerationParams(
        max_new_tokens=64,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        repetition_penalty=1.1,
        stop=("\n\n", "User:"),
        seed=42,
        token_ids=True,
    )
    yield Case(
        "prompt_full",
        "a prompt with an inline PNG and every parameter",
        encode(Prompt("p2", "Describe this", (PNG_1X1,), params)),
    )
    yield Case(
        "prompt_images_only",
        "empty text with an image: valid on the wire (the session needs text or images)",
        encode(Prompt("p3", "", (PNG_1X1,))),
    )
    yield Case(
        "prompt_params_int_for_float",
        "float params given as msgpack ints, as JavaScript encoders send 1.0; decoded as floats",
        _prompt_with({"temperature": 1, "top_p": 1, "repetition_penalty": 2}),
    )
    yield Case(
        "prompt_params_float32",
        "float params encoded as float32 (0xca): accepted, widened to float64",
        msgpack.packb(
            {"type": "prompt", "id": "p", "text": "x", "params": {"temperature": 0.5}},
            use_single_float=True,
        ),
        canonical=False,
    )
    yield Case(
        "prompt_params_edges",
        "every parameter at the edge of its range",
        _prompt_with(
            {
                "max_new_tokens": 1,
                "temperature": 0,
                "top_p": 1.0,
                "top_k": 0,
                "repetition_penalty": 2.0,
                "stop": ["\U0001f600" * 64, "a", "b", "c"],
                "seed": 2**64 - 1,
                "token_ids": False,
            }
        ),
    )
    yield Case("prompt_params_seed_int64_min", "seed at -2^63", _prompt_with({"seed": -(2**63)}))
    yield Case(
        "prompt_response_format_json_schema",
        "a reply held to a strict JSON schema, with each token's logprob and 5 alternatives",
        _prompt_with(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "colour",
                        "schema": {
                            "type": "object",
                            "properties": {"name": {"enum": ["red", "blue"]}},
                            "required": ["name"],
                            "additionalProperties": False,
                        },
                        "strict": True,
                    },
                },
                "logprobs": 5,
            }
        ),
    )
    yield Case(
        "prompt_response_format_json_object",
        "a reply that is any JSON object",
        _prompt_with({"response_format": {"type": "json_object"}}),
    )
    yield Case(
        "prompt_response_format_text",
        "type text: no constraint (turns off a default set by configure)",
        _prompt_with({"response_format": {"type": "text"}, "logprobs": 0}),
    )
    yield Case(
        "prompt_params_nil_values",
        "a nil param is the same as an absent one",
        _prompt_with({"temperature": None, "seed": None}),
    )
    yield Case("prompt_params_nil", "params nil is the same as absent", _prompt_with(None))
    yield Case(
        "prompt_unknown_keys_ignored",
        "unknown top-level keys are ignored (forward compatibility)",
        pack({"type": "prompt", "id": "p", "text": "x", "x_future": [1, 2], "trace": {"a": 1}}),
    )
    yield Case(
        "prompt_keys_in_any_order",
        "`type` need not come first",
        pack({"text": "x", "id": "p", "type": "prompt"}),
    )
    yield Case(
        "prompt_id_64_chars_4_byte_utf8",
        "an id of 64 characters, each 4 bytes of UTF-8 (256 bytes, str8)",
        encode(Prompt("\U0001f600" * 64, "\U0001d11e clef")),
    )
    yield Case("image_png", "an image with mime", encode(Image("i1", PNG_1X1, "image/png")))
    yield Case(
        "image_bin16",
        "image data of 300 bytes (bin16; not an image: the session says bad_image)",
        encode(Image("i2", _pattern(300))),
    )
    yield Case(
        "image_empty_data", "empty bin8 (the session says bad_image)", encode(Image("i4", b""))
    )
    yield Case("cancel_id", "cancel a named generation", encode(Cancel("p1")))
    yield Case("cancel_no_id", "cancel whatever runs", encode(Cancel()))
    yield Case(
        "cancel_id_nil", "an id of nil is the same as no id", pack({"type": "cancel", "id": None})
    )
    yield Case("reset", "reset", encode(Reset()))
    yield Case("ping_no_t", "a ping without t", encode(Ping()))
    yield Case("ping_t_nil", "a ping whose t is nil (the pong carries t: nil)", ping(None))
    yield Case(
        "ping_at_max_ping_bytes",
        "a ping of 4096 bytes: the largest accepted",
        ping_of_bytes(DEFAULT_LIMITS.max_ping_bytes),
    )
    yield Case(
        "configure_full",
        "system prompt and default params",
        encode(Configure("You are brief.", GenerationParams(temperature=0.2, max_new_tokens=100))),
    )
    yield Case("configure_empty", "a configure with nothing in it", encode(Configure()))
    yield Case("configure_system_empty", "an empty system prompt clears it", encode(Configure("")))
    yield Case("rewind", "keep the first 2 exchanges", encode(Rewind(2)))
    yield Case("rewind_keep_0", "drop every exchange", encode(Rewind(0)))
    yield Case("regenerate", "a new reply in place of the last", encode(Regenerate("r1")))
    yield Case(
        "regenerate_params",
        "a regenerate with a new seed and temperature",
        encode(Regenerate("r2", GenerationParams(temperature=0.8, seed=7))),
    )
    yield Case(
        "prompt_tools",
        "a prompt offering a tool with its arguments' schema, the call forced by name",
        _prompt_with(
            {
                "tools": [
                    {
                        "name": "get_weather",
                        "description": "The weather in a city",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                            "required": ["city"],
                        },
                    }
                ],
                "tool_choice": {"name": "get_weather"},
                "parallel_tool_calls": False,
            }
        ),
    )
    yield Case(
        "configure_tools_required",
        "tools as the session's default, a call required of every reply",
        pack(
            {"type": "configure", "params": {"tools": [{"name": "now"}], "tool_choice": "required"}}
        ),
    )
    yield Case(
        "tool_results",
        "the results of a reply's two calls, in any order",
        encode(
            ToolResults("t1", (ToolResult("call_b", '{"temp": 21}'), ToolResult("call_a", "ok")))
        ),
    )


def msgpack_types() -> Iterator[Case]:
    """Every msgpack format the protocol uses, carried in ``ping.t`` (which takes any value)."""
    yield Case("type_true", "true", ping(True))
    yield Case("type_false", "false", ping(False))
    yield Case(
        "type_uint_edges",
        "non-negative ints at each width's edges: fixint, uint8, uint16, uint32, uint64",
        ping([0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]),
    )
    yield Case(
        "type_negative_int_edges",
        "negative ints at each width's edges: fixint, int8, int16, int32, int64",
        ping([-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]),
    )
    yield Case(
        "type_int_js_safe_edges",
        "ints around JavaScript's safe range (2^53)",
        ping([2**53 - 1, 2**53, -(2**53 - 1), -(2**53)]),
    )
    yield Case(
        "type_int_wider_than_needed",
        "ints in wider formats than needed (uint64 1, int8 5, int64 -1, uint16 0): accepted",
        _raw_ping(
            b"\x94\xcf"
            + struct.pack(">Q", 1)
            + b"\xd0\x05\xd3"
            + struct.pack(">q", -1)
            + b"\xcd\x00\x00"
        ),
        canonical=False,
    )
    yield Case(
        "type_float64",
        "float64 values, -0.0 and the subnormal minimum included",
        ping([1.5, 0.0, -0.0, -2.5, 0.1, 1e308, 5e-324]),
    )
    yield Case(
        "type_float32",
        "float32 input (0xca): 1.5, -0.0 and 0.1f, widened to float64",
        _raw_ping(b"\x93" + b"".join(b"\xca" + struct.pack(">f", x) for x in (1.5, -0.0, 0.1))),
        canonical=False,
    )
    yield Case(
        "type_float_non_finite_in_t",
        "NaN and infinities are values in t (refused only in number fields)",
        ping([float("nan"), float("inf"), float("-inf")]),
    )
    yield Case("type_str_empty", "the empty string (fixstr)", ping(""))
    yield Case("type_fixstr_31", "31 bytes: the longest fixstr", ping(_str_of_bytes(31)))
    yield Case("type_str8_32", "32 bytes: the shortest str8", ping(_str_of_bytes(32)))
    yield Case(
        "type_str8_by_bytes",
        "16 characters but 32 bytes: sizes count UTF-8 bytes, not characters",
        ping("\u00e9" * 16),
    )
    yield Case("type_str8_255", "255 bytes: the longest str8", ping(_str_of_bytes(255)))
    yield Case("type_str16_256", "256 bytes: the shortest str16", ping(_str_of_bytes(256)))
    yield Case(
        "type_str32_65536",
        "65536 bytes: the shortest str32 (a prompt's text: a ping this long is over its limit)",
        encode(Prompt("p", _str_of_bytes(65536))),
    )
    yield Case(
        "type_str_non_ascii",
        "2-, 3- and 4-byte UTF-8, U+0000 and U+FFFF",
        ping(["h\u00e9llo", "\u4f60\u597d", "\U0001f600", "\U0001d11e", "\u0000", "\uffff"]),
    )
    yield Case(
        "type_str_wider_than_needed",
        "'abc' as str8 and as str32: accepted",
        _raw_ping(b"\x92\xd9\x03abc\xdb\x00\x00\x00\x03abc"),
        canonical=False,
    )
    yield Case("type_bin8_empty", "empty bin8", ping(b""))
    yield Case("type_bin8_255", "255 bytes: the longest bin8", ping(_pattern(255)))
    yield Case("type_bin16_256", "256 bytes: the shortest bin16", ping(_pattern(256)))
    yield Case(
        "type_bin32_65536",
        "65536 bytes: the shortest bin32 (an image's data: a ping this long is over its limit)",
        encode(Image("i", _pattern(65536))),
    )
    yield Case("type_fixarray_empty", "empty array", ping([]))
    yield Case("type_fixarray_15", "15 items: the longest fixarray", ping(list(range(15))))
    yield Case("type_array16_16", "16 items: the shortest array16", ping(list(range(16))))
    yield Case(
        "type_array32_header",
        "a 2-item array in the array32 format: accepted",
        _raw_ping(b"\xdd\x00\x00\x00\x02\x01\x02"),
        canonical=False,
    )
    yield Case("type_fixmap_empty", "empty map", ping({}))
    yield Case(
        "type_fixmap_15", "15 entries: the longest fixmap", ping({f"k{i}": i for i in range(15)})
    )
    yield Case(
        "type_map16_16", "16 entries: the shortest map16", ping({f"k{i}": i for i in range(16)})
    )
    yield Case(
        "type_map32_header",
        "a 1-entry map in the map32 format: accepted",
        _raw_ping(b"\xdf\x00\x00\x00\x01\xa1k\xc0"),
        canonical=False,
    )
    yield Case(
        "type_frame_map16",
        "the frame's own map with 17 entries (map16; unknown keys ignored)",
        pack({"type": "ping", **{f"x{i}": i for i in range(16)}}),
    )
    yield Case(
        "type_nested_mixed",
        "every type nested in arrays and maps",
        ping({"a": [None, True, 1, -1, 1.5, "s", b"\x00\x01", {"k": [[], {}]}]}),
    )
    nested: Any = None
    for _ in range(63):
        nested = [nested]
    yield Case("type_nested_64_deep", "64 containers deep, the frame's map included", ping(nested))

"""The refused cases of ``protocol/vectors/``: each names the error code decoding must raise."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from wschat.protocol import DEFAULT_LIMITS, ErrorCode, Ping, Prompt, encode

from .vector_cases import Case, pack, ping_of_bytes

BAD = ErrorCode.BAD_FRAME.value
PARAMS = ErrorCode.INVALID_PARAMS.value
LARGE = ErrorCode.TOO_LARGE.value


def _raw_prompt_text(raw_str: bytes) -> bytes:
    """A prompt whose ``text`` is the given raw msgpack str bytes (which packb cannot make)."""
    return b"\x83\xa4type\xa6prompt\xa2id\xa1p\xa4text" + raw_str


def _raw_ping(t: bytes) -> bytes:
    return b"\x82\xa4type\xa4ping\xa1t" + t


def _params(params: Any) -> bytes:
    return pack({"type": "prompt", "id": "p", "text": "x", "params": params})


def msgpack_layer() -> Iterator[Case]:
    """Bytes the msgpack layer refuses before any frame is looked at."""
    frame = encode(Prompt("p1", "Hello"))
    yield Case("empty_message", "no bytes at all", b"", expect=BAD)
    yield Case("truncated_frame", "a prompt missing its last byte", frame[:-1], expect=BAD)
    yield Case("truncated_header", "cut inside a key", b"\x82\xa4typ", expect=BAD)
    yield Case(
        "trailing_byte", "a ping followed by one more byte", encode(Ping()) + b"\x00", expect=BAD
    )
    yield Case("two_frames", "two pings in one message", encode(Ping()) * 2, expect=BAD)
    yield Case("reserved_byte_c1", "0xc1, which msgpack never uses", b"\xc1", expect=BAD)
    yield Case(
        "invalid_utf8", "text holding the byte 0xff", _raw_prompt_text(b"\xa2h\xff"), expect=BAD
    )
    yield Case(
        "overlong_utf8",
        "text holding the overlong NUL C0 80",
        _raw_prompt_text(b"\xa2\xc0\x80"),
        expect=BAD,
    )
    yield Case(
        "surrogate_utf8",
        "text holding the UTF-8 form of the surrogate U+D800",
        _raw_prompt_text(b"\xa3\xed\xa0\x80"),
        expect=BAD,
    )
    yield Case(
        "truncated_utf8",
        "text ending inside a 3-byte character",
        _raw_prompt_text(b"\xa2\xe2\x82"),
        expect=BAD,
    )
    yield Case(
        "int_key", "a frame map with an int key", b"\x82\xa4type\xa4ping\x01\xc0", expect=BAD
    )
    yield Case(
        "bin_key", "a frame map with a bin key", b"\x82\xa4type\xa4ping\xc4\x01k\xc0", expect=BAD
    )
    yield Case(
        "nested_bin_key", "a bin key in a nested map", _raw_ping(b"\x81\xc4\x01k\xc0"), expect=BAD
    )
    yield Case("ext_fixext1", "an ext type (fixext 1)", _raw_ping(b"\xd4\x05\x00"), expect=BAD)
    yield Case(
        "ext8_empty",
        "an ext type with no data (ext 8, length 0)",
        _raw_ping(b"\xc7\x00\x05"),
        expect=BAD,
    )
    yield Case(
        "ext_timestamp",
        "msgpack's timestamp ext (type -1)",
        _raw_ping(b"\xd6\xff" + struct.pack(">I", 0)),
        expect=BAD,
    )
    yield Case(
        "too_deep",
        "1025 containers deep, the frame's map included (the limit is 1024)",
        _raw_ping(b"\x91" * 1023 + b"\x90"),
        expect=BAD,
    )
    yield Case(
        "too_many_containers",
        "65 arrays and maps, the frame's map included (the budget is 64)",
        encode(Ping([[] for _ in range(63)])),
        expect=LARGE,
    )
    yield Case(
        "map32_declares_a_million",
        "a map32 header declaring 1,000,000 entries and no data",
        b"\xdf" + struct.pack(">I", 1_000_000),
        expect=LARGE,
    )
    yield Case(
        "array32_declares_max",
        "an array32 header declaring 2^32-1 items and no data",
        _raw_ping(b"\xdd\xff\xff\xff\xff"),
        expect=LARGE,
    )


def frame_layer() -> Iterator[Case]:
    """Well-formed msgpack that is not a valid client frame."""
    yield Case("not_a_map_array", "an array at the top", pack([1, 2]), expect=BAD)
    yield Case("not_a_map_str", "a str at the top", pack("ping"), expect=BAD)
    yield Case("not_a_map_nil", "nil at the top", pack(None), expect=BAD)
    yield Case("missing_type", "no type", pack({"id": "a"}), expect=BAD)
    yield Case("type_not_str", "type is an int", pack({"type": 1}), expect=BAD)
    yield Case("type_bin", "type is bin, not str", pack({"type": b"ping"}), expect=BAD)
    yield Case("unknown_type", "an unknown type", pack({"type": "nope"}), expect=BAD)
    yield Case(
        "server_type_from_client",
        "a server frame type sent by a client",
        pack({"type": "ready"}),
        expect=BAD,
    )
    yield Case(
        "ping_over_max_ping_bytes",
        "a ping of 4097 bytes (its t would come back in the pong)",
        ping_of_bytes(DEFAULT_LIMITS.max_ping_bytes + 1),
        expect=LARGE,
    )
    prompt = {"type": "prompt", "id": "p", "text": "x"}

    def without(key: str) -> dict[str, Any]:
        return {k: v for k, v in prompt.items() if k != key}

    yield Case("prompt_missing_id", "no id", pack(without("id")), expect=BAD)
    yield Case("prompt_id_nil", "id nil", pack({**prompt, "id": None}), expect=BAD)
    yield Case("prompt_id_int", "id is an int", pack({**prompt, "id": 7}), expect=BAD)
    yield Case("prompt_id_bool", "id is a bool", pack({**prompt, "id": True}), expect=BAD)
    yield Case("prompt_id_empty", "id of 0 characters", pack({**prompt, "id": ""}), expect=BAD)
    yield Case(
        "prompt_id_65_chars", "id of 65 characters", pack({**prompt, "id": "x" * 65}), expect=BAD
    )
    yield Case("prompt_missing_text", "no text", pack(without("text")), expect=BAD)
    yield Case("prompt_text_nil", "text nil", pack({**prompt, "text": None}), expect=BAD)
    yield Case(
        "prompt_text_bin", "text as bin, not str", pack({**prompt, "text": b"x"}), expect=BAD
    )
    yield Case(
        "prompt_images_not_list",
        "images is a bin, not a list",
        pack({**prompt, "images": b"x"}),
        expect=PARAMS,
    )
    yield Case(
        "prompt_images_item_str",
        "an image given as str",
        pack({**prompt, "images": ["x"]}),
        expect=PARAMS,
    )
    yield Case(
        "image_missing_id", "an image without id", pack({"type": "image", "data": b"x"}), expect=BAD
    )
    yield Case(
        "image_missing_data",
        "an image without data",
        pack({"type": "image", "id": "i"}),
        expect=BAD,
    )
    yield Case(
        "image_data_str",
        "image data as str",
        pack({"type": "image", "id": "i", "data": "x"}),
        expect=PARAMS,
    )
    yield Case(
        "image_mime_int",
        "mime is an int",
        pack({"type": "image", "id": "i", "data": b"x", "mime": 1}),
        expect=PARAMS,
    )
    yield Case(
        "cancel_id_int", "cancel id is an int", pack({"type": "cancel", "id": 1}), expect=BAD
    )
    yield Case(
        "cancel_id_empty",
        "cancel id of 0 characters",
        pack({"type": "cancel", "id": ""}),
        expect=BAD,
    )
    yield Case(
        "configure_system_int",
        "system is an int",
        pack({"type": "configure", "system": 1}),
        expect=PARAMS,
    )
    yield Case(
        "configure_params_unknown",
        "an unknown param in configure",
        pack({"type": "configure", "params": {"temp": 1}}),
        expect=PARAMS,
    )
    yield Case("rewind_missing_keep", "a rewind without keep", pack({"type": "rewind"}), expect=BAD)
    for name, description, keep in [
        ("rewind_keep_negative", "keep -1", -1),
        ("rewind_keep_bool", "a bool is not an int", True),
        ("rewind_keep_float", "an int field takes no float, not even 1.0", 1.0),
        ("rewind_keep_str", "keep as str", "1"),
        ("rewind_keep_nil", "keep nil is not an int", None),
    ]:
        yield Case(name, description, pack({"type": "rewind", "keep": keep}), expect=PARAMS)
    yield Case(
        "regenerate_missing_id",
        "a regenerate without id",
        pack({"type": "regenerate"}),
        expect=BAD,
    )
    yield Case(
        "regenerate_params_unknown",
        "an unknown param in regenerate (the error carries its id)",
        pack({"type": "regenerate", "id": "r1", "params": {"temp": 1}}),
        expect=PARAMS,
    )
    for name, description, results in [
        ("tool_results_missing_results", "tool_results without results", None),
        ("tool_results_empty", "no result at all", []),
        (
            "tool_results_content_int",
            "a result's content must be a str",
            [{"call_id": "c", "content": 1}],
        ),
        ("tool_results_twice", "one call answered twice", [{"call_id": "c", "content": "a"}] * 2),
    ]:
        frame = {"type": "tool_results", "id": "t1"}
        yield Case(
            name,
            description,
            pack(frame if results is None else {**frame, "results": results}),
            expect=BAD if results is None else PARAMS,
        )


def _deep(depth: int) -> Any:
    """A schema of ``depth`` nested maps."""
    schema: Any = {}
    for _ in range(depth - 1):
        schema = {"not": schema}
    return schema


def params() -> Iterator[Case]:
    """Every rule of the params list, broken once."""
    nan32 = b"\xca" + struct.pack(">f", float("nan"))
    broken: list[tuple[str, str, Any]] = [
        ("params_not_map", "params is an array", [1]),
        ("params_unknown_key", "a misspelled parameter", {"temp": 0.5}),
        ("params_temperature_nan", "temperature NaN", {"temperature": float("nan")}),
        ("params_top_p_inf", "top_p +infinity", {"top_p": float("inf")}),
        ("params_temperature_neg_inf", "temperature -infinity", {"temperature": float("-inf")}),
        ("params_temperature_bool", "a bool is not a number", {"temperature": True}),
        ("params_temperature_str", "temperature as str", {"temperature": "0.5"}),
        ("params_temperature_negative", "temperature below 0", {"temperature": -0.1}),
        ("params_temperature_over_2", "temperature above 2", {"temperature": 2.5}),
        ("params_top_p_zero", "top_p 0 (the range is (0, 1])", {"top_p": 0}),
        ("params_top_p_over_1", "top_p above 1", {"top_p": 1.01}),
        ("params_repetition_penalty_zero", "repetition_penalty 0", {"repetition_penalty": 0.0}),
        (
            "params_repetition_penalty_over_2",
            "repetition_penalty above 2",
            {"repetition_penalty": 2.1},
        ),
        ("params_max_new_tokens_bool", "a bool is not an int", {"max_new_tokens": True}),
        (
            "params_max_new_tokens_float",
            "an int field takes no float, not even 10.0",
            {"max_new_tokens": 10.0},
        ),
        ("params_max_new_tokens_zero", "max_new_tokens 0", {"max_new_tokens": 0}),
        ("params_max_new_tokens_negative", "max_new_tokens -1", {"max_new_tokens": -1}),
        ("params_top_k_negative", "top_k -1", {"top_k": -1}),
        ("params_top_k_float", "top_k 1.0", {"top_k": 1.0}),
        ("params_seed_str", "seed as str", {"seed": "42"}),
        ("params_seed_bool", "seed as bool", {"seed": False}),
        ("params_token_ids_int", "token_ids 1 (a bool field takes only bools)", {"token_ids": 1}),
        ("params_stop_not_list", "stop as a str", {"stop": "END"}),
        ("params_stop_five", "5 stop strings (at most 4)", {"stop": ["a", "b", "c", "d", "e"]}),
        ("params_stop_empty_string", "an empty stop string", {"stop": [""]}),
        ("params_stop_65_chars", "a stop string of 65 characters", {"stop": ["x" * 65]}),
        ("params_stop_item_int", "a stop item that is an int", {"stop": [1]}),
        ("params_logprobs_21", "logprobs above 20", {"logprobs": 21}),
        ("params_logprobs_bool", "logprobs true (an int field)", {"logprobs": True}),
        (
            "params_response_format_unknown_type",
            "a response_format type other than text, json_object, json_schema",
            {"response_format": {"type": "xml"}},
        ),
        (
            "params_response_format_no_schema",
            "json_schema without its schema",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        ),
        (
            "params_response_format_schema_too_deep",
            "a schema nested 25 deep (at most 24)",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": _deep(25)}}},
        ),
    ]
    for name, description, value in broken:
        yield Case(name, description, _params(value), expect=PARAMS)
    yield Case(
        "params_temperature_nan_float32",
        "temperature NaN encoded as float32",
        b"\x84\xa4type\xa6prompt\xa2id\xa1p\xa4text\xa1x\xa6params\x81\xabtemperature" + nan32,
        expect=PARAMS,
        canonical=False,
    )

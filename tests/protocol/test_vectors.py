"""The committed ``protocol/vectors/`` are what the generator makes, and each decodes as stated
(PROTOCOL.md "Test vectors")."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import msgpack
import pytest
from wschat.protocol import ErrorCode, FinishReason, FrameType, ProtocolError

from .make_vectors import (
    DECODERS,
    VECTORS_DIR,
    all_cases,
    from_json,
    plain_value,
    rendered,
    to_json,
)
from .msgpack_formats import formats

PROTOCOL_FORMATS = {
    "nil", "false", "true", "positive_fixint", "negative_fixint",
    "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float32", "float64", "fixstr", "str8", "str16", "str32", "bin8", "bin16", "bin32",
    "fixarray", "array16", "array32", "fixmap", "map16", "map32",
}  # fmt: skip


@cache
def vectors() -> list[dict[str, Any]]:
    doc = json.loads((VECTORS_DIR / "vectors.json").read_text(encoding="utf-8"))
    return doc["vectors"]  # type: ignore[no-any-return]


def names() -> list[str]:
    return [case.name for case in all_cases()]


def entry(name: str) -> dict[str, Any]:
    return next(v for v in vectors() if v["name"] == name)


def test_committed_vectors_equal_what_the_generator_makes() -> None:
    expected = dict(rendered(all_cases()))
    committed = {p.name: p.read_bytes() for p in VECTORS_DIR.iterdir()}
    assert sorted(committed) == sorted(expected), "run: python -m tests.protocol.make_vectors"
    stale = [name for name, data in expected.items() if committed[name] != data]
    assert stale == [], "run: python -m tests.protocol.make_vectors"


@pytest.mark.parametrize("name", names())
def test_vector_decodes_to_its_stated_result(name: str) -> None:
    vector = entry(name)
    data = (VECTORS_DIR / vector["file"]).read_bytes()
    try:
        frame = DECODERS[vector["direction"]](data)
    except ProtocolError as e:
        assert (e.code.value, e.id) == (vector["result"], vector["error_id"])
        return
    assert vector["result"] == "ok" and frame.TYPE.value == vector["frame"]
    assert to_json(frame.to_wire()) == vector.get("decoded", vector["value"])


@pytest.mark.parametrize("name", names())
def test_vector_value_is_its_plain_msgpack_meaning(name: str) -> None:
    vector = entry(name)
    data = (VECTORS_DIR / vector["file"]).read_bytes()
    accepted, value = plain_value(data)
    assert accepted is vector["msgpack_valid"]
    if not accepted:
        assert "value" not in vector and vector["result"] != "ok"
        return
    # compared as bytes, so -0.0, NaN and int-versus-float all count
    packed = msgpack.packb(from_json(vector["value"]), use_bin_type=True)
    assert packed == msgpack.packb(value, use_bin_type=True)
    assert (packed == data) is vector["canonical"]
    assert vector["formats"] == formats(data)


def test_vectors_cover_every_msgpack_format_the_protocol_uses() -> None:
    covered = {f for v in vectors() for f in v["formats"]}
    assert covered == PROTOCOL_FORMATS


def test_vectors_cover_every_frame_type_error_code_and_finish_reason() -> None:
    valid = [v for v in vectors() if v["result"] == "ok"]
    assert {v["frame"] for v in valid} == set(FrameType)
    sent_codes = {v["value"]["code"] for v in valid if v["frame"] == "error"}
    assert sent_codes == set(ErrorCode)
    assert {v["value"]["reason"] for v in valid if v["frame"] == "done"} == set(FinishReason)
    decode_errors = {v["result"] for v in vectors() if v["result"] != "ok"}
    assert decode_errors == {"bad_frame", "invalid_params", "too_large"}
    assert {v["direction"] for v in vectors() if v["result"] != "ok"} == {"client", "server"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2**64 - 1, ["uint64"]),
        (-(2**63), ["int64"]),
        ({"a": [1.5, b"x", None]}, ["bin8", "fixarray", "fixmap", "fixstr", "float64", "nil"]),
        ("x" * 70_000, ["str32"]),
        (list(range(20)), ["array16", "positive_fixint"]),
    ],
)
def test_format_scanner_names_what_packb_wrote(value: Any, expected: list[str]) -> None:
    assert formats(msgpack.packb(value, use_bin_type=True)) == expected


def test_json_form_tags_bin_floats_and_big_ints_and_reads_them_back() -> None:
    value = [b"\x00\xff", 1.0, -0.0, float("inf"), 2**53, -(2**53) + 1, "s", None, True]
    form = to_json(value)
    assert form == [
        {"$bin": "AP8="},
        {"$float": 1.0},
        {"$float": -0.0},
        {"$float": "Infinity"},
        {"$int": "9007199254740992"},
        -(2**53) + 1,
        "s",
        None,
        True,
    ]
    back = from_json(json.loads(json.dumps(form)))
    assert msgpack.packb(back, use_bin_type=True) == msgpack.packb(value, use_bin_type=True)

"""Write ``protocol/vectors/`` from the cases and the Python codec.

    python -m tests.protocol.make_vectors [OUT_DIR]

Each case becomes ``<name>.msgpack`` and an entry of ``vectors.json`` (PROTOCOL.md "Test
vectors" describes the format). A case whose stated result the codec does not give stops the
run before anything is written.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgpack
from wschat.protocol import (
    DEFAULT_LIMITS,
    SERVER_FRAME_LIMITS,
    ProtocolError,
    decode_client_frame,
    decode_server_frame,
)
from wschat.protocol.codec import MAX_DEPTH

from . import invalid_cases, server_cases, vector_cases
from .msgpack_formats import formats
from .vector_cases import OK, Case

VECTORS_DIR = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
JS_SAFE_INT = 2**53 - 1
DECODERS = {"client": decode_client_frame, "server": decode_server_frame}


def all_cases() -> list[Case]:
    return [
        *vector_cases.client_frames(),
        *vector_cases.msgpack_types(),
        *server_cases.server_frames(),
        *invalid_cases.msgpack_layer(),
        *invalid_cases.frame_layer(),
        *invalid_cases.params(),
        *server_cases.server_layer(),
    ]


def to_json(value: Any) -> Any:
    """msgpack's data model as JSON: bin, floats and ints beyond 2^53 are tagged."""
    if value is None or type(value) in (bool, str):
        return value
    if type(value) is int:
        return value if abs(value) <= JS_SAFE_INT else {"$int": str(value)}
    if type(value) is float:
        if math.isnan(value):
            return {"$float": "NaN"}
        if math.isinf(value):
            return {"$float": "Infinity" if value > 0 else "-Infinity"}
        return {"$float": value}
    if type(value) is bytes:
        return {"$bin": base64.b64encode(value).decode("ascii")}
    if type(value) is list:
        return [to_json(v) for v in value]
    if type(value) is dict:
        return {k: to_json(v) for k, v in value.items()}
    raise TypeError(f"no JSON form for {type(value).__name__}")


def from_json(value: Any) -> Any:
    if type(value) is list:
        return [from_json(v) for v in value]
    if type(value) is dict:
        if len(value) == 1 and next(iter(value)) in _TAGS:
            ((tag, raw),) = value.items()
            return _TAGS[tag](raw)
        return {k: from_json(v) for k, v in value.items()}
    return value


_TAGS: dict[str, Callable[[Any], Any]] = {
    "$int": int,
    "$float": float,  # float("NaN"), float("Infinity") and float(-0.0) all do the right thing
    "$bin": base64.b64decode,
}


def plain_value(data: bytes) -> tuple[bool, Any]:
    """(True, value) when the msgpack layer accepts ``data`` as one value, else (False, None).

    The msgpack layer of PROTOCOL.md "Encoding": str keys, no ext, one value, nothing after it,
    at most ``MAX_DEPTH`` deep; no length limits (those belong to a decoder's configuration).
    """
    unpacker = msgpack.Unpacker(
        raw=False,
        object_hook=_str_keys,
        ext_hook=_refuse,
        max_ext_len=0,
        max_buffer_size=len(data) + 1,
    )
    unpacker.feed(data)
    try:
        value = unpacker.unpack()
    except (ValueError, msgpack.UnpackException, TypeError, _Refused):
        return False, None
    if unpacker.tell() != len(data):
        return False, None
    return True, value


class _Refused(Exception):
    pass


def _refuse(*args: Any) -> Any:
    raise _Refused


def _str_keys(value: dict[Any, Any]) -> dict[Any, Any]:
    if not all(type(k) is str for k in value):
        raise _Refused
    return value


def describe(case: Case) -> dict[str, Any]:
    """The ``vectors.json`` entry of one case, after checking its claims against the codec."""
    accepted, value = plain_value(case.data)
    entry: dict[str, Any] = {
        "name": case.name,
        "file": f"{case.name}.msgpack",
        "description": case.description,
        "direction": case.direction,
        "formats": formats(case.data) if accepted else [],
        "msgpack_valid": accepted,
    }
    if accepted:
        entry["value"] = to_json(value)
        entry["canonical"] = msgpack.packb(value, use_bin_type=True) == case.data
        if entry["canonical"] != case.canonical:
            raise AssertionError(f"{case.name}: canonical is {entry['canonical']}")
    try:
        frame = DECODERS[case.direction](case.data)
    except ProtocolError as e:
        if e.code.value != case.expect:
            raise AssertionError(
                f"{case.name}: decoding gave {e.code.value}, not {case.expect}"
            ) from e
        entry.update(result=e.code.value, error_id=e.id)
        return entry
    if case.expect != OK:
        raise AssertionError(f"{case.name}: decoded, but {case.expect} was expected")
    entry.update(result=OK, frame=frame.TYPE.value)
    decoded = to_json(frame.to_wire())
    if decoded != entry["value"]:
        entry["decoded"] = decoded
    return entry


def document(cases: list[Case]) -> dict[str, Any]:
    return {
        "protocol": 1,
        "generator": "python -m tests.protocol.make_vectors",
        "spec": "protocol/PROTOCOL.md, section 'Test vectors'",
        "limits": {
            "client": asdict(DEFAULT_LIMITS),
            "server": asdict(SERVER_FRAME_LIMITS),
            "max_depth": MAX_DEPTH,
        },
        "vectors": [describe(case) for case in cases],
    }


def rendered(cases: list[Case]) -> Iterator[tuple[str, bytes]]:
    """Every file of the vectors folder, by name, as bytes."""
    names = [case.name for case in cases]
    if len(set(names)) != len(names):
        raise AssertionError("case names must be unique")
    doc = json.dumps(document(cases), indent=1, ensure_ascii=False) + "\n"
    yield "vectors.json", doc.encode("utf-8")
    for case in cases:
        yield f"{case.name}.msgpack", case.data


def write(out: Path) -> int:
    files = dict(rendered(all_cases()))  # every check runs before the first write
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.msgpack"):
        if stale.name not in files:
            stale.unlink()
    for name, data in files.items():
        (out / name).write_bytes(data)
    return len(files) - 1


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else VECTORS_DIR
    count = write(out)
    print(f"wrote {count} vectors to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

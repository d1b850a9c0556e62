"""A session's state as bytes for a store outside this process: msgpack, with the images of
the engine's form (numpy arrays, Pillow images) as extension types.

What it holds is ``Session.export_state``'s; ``unpack`` only rebuilds plain data and the two
image forms (a dtype from a short list, a shape that matches the bytes), so a store's bytes
can never make it run code, and ``Bounds`` caps each list, string and image before it is even
built, so bytes made up to be huge are refused early (what is left to check, ids and sizes
against the engine, is ``Session.import_state``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

FORMAT_VERSION = 2  # 2: the state names its engine's model and tokenizer (a fingerprint)
_ARRAY = 1  # ext type: [dtype, shape, bytes]
_PIL = 2  # ext type: [mode, width, height, bytes]
_DTYPES = frozenset({"|u1", "<f4", "<f2", "<i4", "<i8", "<f8"})


class SnapshotError(ValueError):
    """Bytes that are not a snapshot this version reads."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The most a stored state holds of each kind, as a live session's would."""

    items: int  # in one list or map (a conversation's ids, the prompt ids it used)
    values: int  # in all its lists and maps together, each list or map counting one more
    text_bytes: int  # in one string (a system prompt is the longest: one frame)
    image_bytes: int  # in one image


def _limits(bounds: Bounds | None) -> dict[str, Any]:
    if bounds is None:
        return {}
    left = bounds.values

    def counted(container: Any) -> Any:
        # msgpack builds values in C without a pause: counting as it goes stops bytes that hold
        # millions of small ones after the first ``values``, not once all are built
        nonlocal left
        left -= len(container) + 1
        if left < 0:
            raise SnapshotError(f"over {bounds.values} values")
        return container

    return {
        "max_array_len": bounds.items,
        "max_map_len": bounds.items,
        "max_str_len": bounds.text_bytes,
        "max_bin_len": bounds.image_bytes,
        "max_ext_len": bounds.image_bytes + 64,  # an image's ext: its bytes and a short header
        "list_hook": counted,
        "object_hook": counted,
    }


def pack(state: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb({"v": FORMAT_VERSION, "state": state}, default=_encode_image)
    return data


def unpack(data: bytes, bounds: Bounds | None = None) -> dict[str, Any]:
    try:
        outer = msgpack.unpackb(
            data, ext_hook=_decode_image, strict_map_key=True, **_limits(bounds)
        )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as e:
        raise SnapshotError(f"not a session snapshot: {e}") from e
    if not isinstance(outer, dict) or outer.get("v") != FORMAT_VERSION:
        raise SnapshotError("a session snapshot of another version")
    state = outer.get("state")
    if not isinstance(state, dict):
        raise SnapshotError("a session snapshot without its state")
    return state


def _encode_image(obj: Any) -> msgpack.ExtType:
    if hasattr(obj, "__array_interface__") and hasattr(obj, "dtype"):  # numpy, no import
        dtype = obj.dtype.str
        if dtype not in _DTYPES:
            raise TypeError(f"an array of {dtype} is not kept in a snapshot")
        body = [dtype, list(obj.shape), obj.tobytes(order="C")]
        return msgpack.ExtType(_ARRAY, msgpack.packb(body))
    if hasattr(obj, "mode") and hasattr(obj, "tobytes") and hasattr(obj, "size"):  # Pillow
        width, height = obj.size
        return msgpack.ExtType(_PIL, msgpack.packb([obj.mode, width, height, obj.tobytes()]))
    raise TypeError(f"{type(obj).__name__} is not kept in a snapshot")


def _decode_image(code: int, data: bytes) -> Any:
    body = msgpack.unpackb(data)
    if code == _ARRAY:
        import numpy as np

        dtype, shape, raw = body
        if dtype not in _DTYPES or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise SnapshotError("an array in a snapshot with a bad dtype or shape")
        array = np.frombuffer(raw, dtype=np.dtype(dtype))
        count = 1
        for n in shape:
            count *= n
        if array.size != count:
            raise SnapshotError("an array in a snapshot whose bytes do not fill its shape")
        return array.reshape(shape).copy()
    if code == _PIL:
        from PIL import Image

        mode, width, height, raw = body
        if mode not in ("RGB", "RGBA", "L"):
            raise SnapshotError(f"an image in a snapshot in mode {mode!r}")
        return Image.frombytes(mode, (width, height), raw)
    raise SnapshotError(f"an unknown extension type {code} in a snapshot")

"""How a frame's fields are declared, read and written: each field a ``spec`` that knows how to
read itself, on a ``Record`` (a map: a frame, or a map inside one); a ``Frame`` is a Record with
its wire ``TYPE``.

``to_wire()`` turns a record into a plain map, leaving out what is unset; ``from_wire()`` builds one
from a map, checking every field it reads, and raises ``ProtocolError`` subclasses only. Unknown
keys are ignored for forward compatibility. The readers here are the field types every frame
shares; ``frames.py`` declares the frames with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Self

from .constants import FrameType
from .errors import BadFrame
from .fields import as_bool, as_float, as_int, as_str
from .params import GenerationParams
from .tools import ToolResult


class _Absent:
    """Marks a field that was not on the wire (``ping`` without ``t``), distinct from nil."""

    _instance: ClassVar[_Absent | None] = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()

Reader = Callable[[Mapping[str, Any], str], Any]


def required(check: Callable[[object, str], Any]) -> Reader:
    def read(data: Mapping[str, Any], key: str) -> Any:
        if key not in data:
            raise BadFrame(f"missing field {key!r}")
        return check(data[key], key)

    return read


def optional(check: Callable[[object, str], Any], default: Any = None) -> Reader:
    def read(data: Mapping[str, Any], key: str) -> Any:
        value = data.get(key)
        return default if value is None else check(value, key)

    return read


def any_value(data: Mapping[str, Any], key: str) -> Any:
    return data.get(key, ABSENT)


def enum_of(kind: type[Enum]) -> Callable[[object, str], Any]:
    def check(value: object, key: str) -> Any:
        try:
            return kind(as_str(value, key))
        except ValueError:
            raise BadFrame(f"unknown {key} {value!r}") from None

    return check


def nested(kind: type[Record]) -> Callable[[object, str], Any]:
    def check(value: object, key: str) -> Any:
        if not isinstance(value, Mapping):
            raise BadFrame(f"{key} must be a map")
        return kind.from_wire(value)

    return check


def value_list(value: object, key: str) -> tuple[Any, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list")
    return tuple(value)


def int_list(value: object, key: str) -> tuple[int, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list of ints")
    return tuple(as_int(item, key, BadFrame) for item in value)


def mapping(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise BadFrame(f"{key} must be a map")
    return dict(value)


def integer(value: object, key: str) -> int:
    return as_int(value, key, BadFrame)


def number(value: object, key: str) -> float:
    return as_float(value, key, BadFrame)


def string(value: object, key: str) -> str:
    return as_str(value, key, BadFrame)


def boolean(value: object, key: str) -> bool:
    return as_bool(value, key, BadFrame)


def spec(read: Reader, *, keep_nil: bool = False, **kw: Any) -> Any:
    """A dataclass field that knows how to read itself; ``keep_nil`` sends None as nil."""
    return dataclasses.field(metadata={"read": read, "keep_nil": keep_nil}, **kw)


def _wire_value(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, GenerationParams | ToolResult):
        return value.to_wire()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_wire_value(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Record:
    """A map whose fields are declared with ``spec``; the base of frames and nested maps."""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is ABSENT or (value is None and not f.metadata.get("keep_nil")):
                continue
            if value == () and f.default == ():  # an empty optional list is left out
                continue
            out[f.name] = _wire_value(value)
        return out

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        values = {f.name: f.metadata["read"](data, f.name) for f in dataclasses.fields(cls)}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Frame(Record):
    TYPE: ClassVar[FrameType]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE.value, **Record.to_wire(self)}

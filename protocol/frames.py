"""Every frame of the protocol as a frozen dataclass (PROTOCOL.md "Client frames", "Server frames").

A frame knows its wire ``TYPE``, turns itself into a plain map with ``to_wire()`` and is built from
one with ``from_wire()``, which checks every field it reads and raises ``ProtocolError`` subclasses
only. Unknown top-level keys are ignored for forward compatibility.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Self

from .constants import ErrorCode, FinishReason, FrameType
from .errors import BadFrame, InvalidParams
from .fields import as_bool, as_bytes, as_float, as_id, as_int, as_series, as_str
from .params import GenerationParams, parse_params


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


def _any(data: Mapping[str, Any], key: str) -> Any:
    return data.get(key, ABSENT)


def _enum(kind: type[Enum]) -> Callable[[object, str], Any]:
    def check(value: object, key: str) -> Any:
        try:
            return kind(as_str(value, key))
        except ValueError:
            raise BadFrame(f"unknown {key} {value!r}") from None

    return check


def _nested(kind: type[Record]) -> Callable[[object, str], Any]:
    def check(value: object, key: str) -> Any:
        if not isinstance(value, Mapping):
            raise BadFrame(f"{key} must be a map")
        return kind.from_wire(value)

    return check


def _images(value: object, key: str) -> tuple[bytes, ...]:
    if type(value) is not list:
        raise InvalidParams("images must be a list of binary images")
    return tuple(as_bytes(item, key, InvalidParams) for item in value)


def _params(value: object, key: str) -> GenerationParams:
    return parse_params(value)


def _opt_str(value: object, key: str) -> str:
    return as_str(value, key, InvalidParams)


def _str_list(value: object, key: str) -> tuple[Any, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list")
    return tuple(value)


def _int_list(value: object, key: str) -> tuple[int, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list of ints")
    return tuple(as_int(item, key, BadFrame) for item in value)


def _map(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise BadFrame(f"{key} must be a map")
    return dict(value)


def _int(value: object, key: str) -> int:
    return as_int(value, key, BadFrame)


def _float(value: object, key: str) -> float:
    return as_float(value, key, BadFrame)


def _str(value: object, key: str) -> str:
    return as_str(value, key, BadFrame)


def _bool(value: object, key: str) -> bool:
    return as_bool(value, key, BadFrame)


def spec(read: Reader, *, keep_nil: bool = False, **kw: Any) -> Any:
    """A dataclass field that knows how to read itself; ``keep_nil`` sends None as nil."""
    return dataclasses.field(metadata={"read": read, "keep_nil": keep_nil}, **kw)


def _wire_value(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, GenerationParams):
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


# -- client frames -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prompt(Frame):
    TYPE = FrameType.PROMPT
    id: str = spec(required(lambda v, k: as_id(v, k)))
    text: str = spec(required(_str))
    images: tuple[bytes, ...] = spec(optional(_images, ()), default=())
    params: GenerationParams | None = spec(optional(_params), default=None)


@dataclass(frozen=True, slots=True)
class Image(Frame):
    TYPE = FrameType.IMAGE
    id: str = spec(required(lambda v, k: as_id(v, k)))
    data: bytes = spec(required(lambda v, k: as_bytes(v, k, InvalidParams)))
    mime: str | None = spec(optional(_opt_str), default=None)


@dataclass(frozen=True, slots=True)
class Cancel(Frame):
    TYPE = FrameType.CANCEL
    id: str | None = spec(optional(lambda v, k: as_id(v, k)), default=None)


@dataclass(frozen=True, slots=True)
class Reset(Frame):
    TYPE = FrameType.RESET


@dataclass(frozen=True, slots=True)
class Ping(Frame):
    TYPE = FrameType.PING
    t: Any = spec(_any, keep_nil=True, default=ABSENT)


@dataclass(frozen=True, slots=True)
class Configure(Frame):
    TYPE = FrameType.CONFIGURE
    system: str | None = spec(optional(_opt_str), default=None)
    params: GenerationParams | None = spec(optional(_params), default=None)


def _keep(value: object, key: str) -> int:
    count = as_int(value, key, InvalidParams)
    if count < 0:
        raise InvalidParams(f"{key} must be 0 or more")
    return count


@dataclass(frozen=True, slots=True)
class Rewind(Frame):
    """Keep the first ``keep`` exchanges of the conversation, drop the rest (PROTOCOL.md
    section 5); whether the conversation holds that many is the session's to say."""

    TYPE = FrameType.REWIND
    keep: int = spec(required(_keep))


@dataclass(frozen=True, slots=True)
class Regenerate(Frame):
    """A new generation, ``id``, in place of the conversation's last exchange: its user turn
    again, under ``params`` over the session's defaults (PROTOCOL.md section 5)."""

    TYPE = FrameType.REGENERATE
    id: str = spec(required(lambda v, k: as_id(v, k)))
    params: GenerationParams | None = spec(optional(_params), default=None)


ClientFrame = Prompt | Image | Cancel | Reset | Ping | Configure | Rewind | Regenerate

# -- server frames -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capabilities(Record):
    images: bool = spec(required(_bool))
    max_images: int = spec(required(_int))


@dataclass(frozen=True, slots=True)
class Limits(Record):
    max_frame_bytes: int = spec(required(_int))
    max_image_bytes: int = spec(required(_int))
    context_tokens: int = spec(required(_int))
    max_new_tokens: int = spec(required(_int))
    max_image_pixels: int = spec(required(_int))
    max_images: int | None = spec(optional(_int), default=None)
    max_prompt_bytes: int | None = spec(optional(_int), default=None)
    max_prompt_tokens: int | None = spec(optional(_int), default=None)
    frames_per_second: int | None = spec(optional(_int), default=None)
    idle_timeout_s: float | None = spec(optional(_float), default=None)


@dataclass(frozen=True, slots=True)
class Resumed(Record):
    """What a resumed session's ``ready`` says (PROTOCOL.md section 10): the id of the last
    prompt whose exchange the conversation holds, and the reply whose frames follow (both nil
    when there is none), and how many exchanges the conversation holds (absent from a server
    older than ``rewind``)."""

    last_prompt: str | None = spec(optional(_str), keep_nil=True, default=None)
    reply: str | None = spec(optional(_str), keep_nil=True, default=None)
    turns: int | None = spec(optional(_int), default=None)


@dataclass(frozen=True, slots=True)
class Ready(Frame):
    TYPE = FrameType.READY
    v: int = spec(required(_int))
    session: str = spec(required(_str))
    resume: str = spec(required(_str))
    model: str = spec(required(_str))
    capabilities: Capabilities = spec(required(_nested(Capabilities)))
    limits: Limits = spec(required(_nested(Limits)))
    engine: str | None = spec(optional(_str), default=None)
    prompt_format: str | None = spec(optional(_str), default=None)
    resumed: Resumed | None = spec(optional(_nested(Resumed)), default=None)
    about: str | None = spec(optional(_str), default=None)


@dataclass(frozen=True, slots=True)
class Configured(Frame):
    TYPE = FrameType.CONFIGURED


@dataclass(frozen=True, slots=True)
class ImageOk(Frame):
    TYPE = FrameType.IMAGE_OK
    id: str = spec(required(_str))
    width: int = spec(required(_int))
    height: int = spec(required(_int))


@dataclass(frozen=True, slots=True)
class ResetOk(Frame):
    TYPE = FrameType.RESET_OK


@dataclass(frozen=True, slots=True)
class Rewound(Frame):
    TYPE = FrameType.REWOUND
    turns: int = spec(required(_int))


@dataclass(frozen=True, slots=True)
class Pong(Frame):
    TYPE = FrameType.PONG
    t: Any = spec(_any, keep_nil=True, default=ABSENT)


@dataclass(frozen=True, slots=True)
class Queued(Frame):
    TYPE = FrameType.QUEUED
    id: str = spec(required(_str))
    position: int = spec(required(_int))


@dataclass(frozen=True, slots=True)
class Start(Frame):
    TYPE = FrameType.START
    id: str = spec(required(_str))
    prompt_tokens: int = spec(required(_int))
    cached_tokens: int = spec(required(_int))
    queued_ms: float = spec(required(_float))


@dataclass(frozen=True, slots=True)
class Token(Frame):
    TYPE = FrameType.TOKEN
    id: str = spec(required(_str))
    text: str = spec(required(_str))
    index: int = spec(required(_int))
    ids: tuple[int, ...] | None = spec(optional(_int_list), default=None)


@dataclass(frozen=True, slots=True)
class Usage(Record):
    prompt_tokens: int = spec(required(_int))
    completion_tokens: int = spec(required(_int))
    cached_tokens: int = spec(required(_int))


@dataclass(frozen=True, slots=True)
class Timing(Record):
    queued_ms: float = spec(required(_float))
    ttft_ms: float | None = spec(optional(_float), keep_nil=True)
    decode_tokens_per_s: float = spec(required(_float))
    total_ms: float = spec(required(_float))


@dataclass(frozen=True, slots=True)
class Done(Frame):
    TYPE = FrameType.DONE
    id: str = spec(required(_str))
    reason: FinishReason = spec(required(_enum(FinishReason)))
    text: str = spec(required(_str))
    usage: Usage = spec(required(_nested(Usage)))
    timing: Timing = spec(required(_nested(Timing)))
    # the 1-based index of the exchange the reply is in the conversation; nil when not kept
    turn: int | None = spec(optional(_int), keep_nil=True, default=None)


@dataclass(frozen=True, slots=True)
class Error(Frame):
    TYPE = FrameType.ERROR
    code: ErrorCode = spec(required(_enum(ErrorCode)))
    message: str = spec(required(_str))
    id: str | None = spec(optional(_str), default=None)


@dataclass(frozen=True, slots=True)
class GoAway(Frame):
    TYPE = FrameType.GOAWAY
    in_ms: int = spec(required(_int))


# ``stats.history``'s series: what the dashboard charts, one sample a second
HISTORY_SERIES = ("tokens_per_s", "running", "queued", "sessions", "ttft_p50_ms", "ttft_p95_ms")


@dataclass(frozen=True, slots=True)
class Stats(Frame):
    """Dashboard snapshot, one a second on ``/v1/stats``; the first a socket gets carries the
    last minutes' samples (``history``)."""

    TYPE = FrameType.STATS
    sessions: int = spec(required(_int))
    running: int = spec(required(_int))
    queued: int = spec(required(_int))
    tokens_per_s: float = spec(required(_float))
    ttft_p50_ms: float | None = spec(optional(_float), keep_nil=True)
    ttft_p95_ms: float | None = spec(optional(_float), keep_nil=True)
    cancellations: int = spec(required(_int))
    errors: dict[str, Any] = spec(required(_map))
    kv_tokens: int | None = spec(optional(_int), keep_nil=True)
    model: str = spec(required(_str))
    device: str = spec(required(_str))
    uptime_s: float = spec(required(_float))
    live: tuple[Any, ...] = spec(optional(_str_list, ()), default=())
    kv_bytes: int | None = spec(optional(_int), default=None)
    kv_budget_bytes: int | None = spec(optional(_int), default=None)
    rewinds: int | None = spec(optional(_int), default=None)
    regenerates: int | None = spec(optional(_int), default=None)
    history: dict[str, tuple[float | None, ...]] | None = spec(
        optional(lambda v, k: as_series(v, k, HISTORY_SERIES)), default=None
    )


ServerFrame = (
    Ready
    | Configured
    | ImageOk
    | ResetOk
    | Rewound
    | Pong
    | Queued
    | Start
    | Token
    | Done
    | Error
    | GoAway
    | Stats
)

CLIENT_FRAMES: dict[FrameType, type[ClientFrame]] = {
    cls.TYPE: cls for cls in (Prompt, Image, Cancel, Reset, Ping, Configure, Rewind, Regenerate)
}
SERVER_FRAMES: dict[FrameType, type[ServerFrame]] = {
    cls.TYPE: cls
    for cls in (
        Ready,
        Configured,
        ImageOk,
        ResetOk,
        Rewound,
        Pong,
        Queued,
        Start,
        Token,
        Done,
        Error,
        GoAway,
        Stats,
    )
}

"""Every frame of the protocol as a frozen dataclass (PROTOCOL.md "Client frames", "Server frames").

A frame knows its wire ``TYPE``, turns itself into a plain map with ``to_wire()`` and is built from
one with ``from_wire()``, which checks every field it reads and raises ``ProtocolError`` subclasses
only (``records.py``: how a field is declared, read and written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .constants import ErrorCode, FinishReason, FrameType
from .errors import BadFrame, InvalidParams
from .fields import as_bytes, as_float, as_id, as_int, as_series, as_str
from .params import GenerationParams, parse_params
from .records import (
    ABSENT,
    Frame,
    Record,
    any_value,
    boolean,
    enum_of,
    int_list,
    integer,
    mapping,
    nested,
    number,
    optional,
    required,
    spec,
    string,
    value_list,
)
from .tools import ToolResult, parse_results


def _images(value: object, key: str) -> tuple[bytes, ...]:
    if type(value) is not list:
        raise InvalidParams("images must be a list of binary images")
    return tuple(as_bytes(item, key, InvalidParams) for item in value)


def _params(value: object, key: str) -> GenerationParams:
    return parse_params(value)


def _opt_str(value: object, key: str) -> str:
    return as_str(value, key, InvalidParams)


def _str_items(value: object, key: str) -> tuple[str, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list of strings")
    return tuple(as_str(item, key, BadFrame) for item in value)


def _bin_items(value: object, key: str) -> tuple[bytes, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list of binaries")
    return tuple(as_bytes(item, key, BadFrame) for item in value)


def _float_items(value: object, key: str) -> tuple[float, ...]:
    if type(value) is not list:
        raise BadFrame(f"{key} must be a list of numbers")
    return tuple(as_float(item, key, BadFrame) for item in value)


# -- client frames -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prompt(Frame):
    TYPE = FrameType.PROMPT
    id: str = spec(required(lambda v, k: as_id(v, k)))
    text: str = spec(required(string))
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
    t: Any = spec(any_value, keep_nil=True, default=ABSENT)


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


@dataclass(frozen=True, slots=True)
class ToolResults(Frame):
    """The results of the calls the conversation's last reply made, one per call: a new
    generation, ``id``, that goes on with the same exchange (PROTOCOL.md "Tool calls")."""

    TYPE = FrameType.TOOL_RESULTS
    id: str = spec(required(lambda v, k: as_id(v, k)))
    results: tuple[ToolResult, ...] = spec(required(lambda v, k: parse_results(v)))
    params: GenerationParams | None = spec(optional(_params), default=None)


ClientFrame = Prompt | Image | Cancel | Reset | Ping | Configure | Rewind | Regenerate | ToolResults

# -- server frames -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capabilities(Record):
    images: bool = spec(required(boolean))
    max_images: int = spec(required(integer))


@dataclass(frozen=True, slots=True)
class Limits(Record):
    max_frame_bytes: int = spec(required(integer))
    max_image_bytes: int = spec(required(integer))
    context_tokens: int = spec(required(integer))
    max_new_tokens: int = spec(required(integer))
    max_image_pixels: int = spec(required(integer))
    max_images: int | None = spec(optional(integer), default=None)
    max_prompt_bytes: int | None = spec(optional(integer), default=None)
    max_prompt_tokens: int | None = spec(optional(integer), default=None)
    frames_per_second: int | None = spec(optional(integer), default=None)
    idle_timeout_s: float | None = spec(optional(number), default=None)


@dataclass(frozen=True, slots=True)
class Resumed(Record):
    """What a resumed session's ``ready`` says (PROTOCOL.md section 10): the id of the last
    prompt whose exchange the conversation holds, and the reply whose frames follow (both nil
    when there is none), and how many exchanges the conversation holds (absent from a server
    older than ``rewind``)."""

    last_prompt: str | None = spec(optional(string), keep_nil=True, default=None)
    reply: str | None = spec(optional(string), keep_nil=True, default=None)
    turns: int | None = spec(optional(integer), default=None)


@dataclass(frozen=True, slots=True)
class Ready(Frame):
    TYPE = FrameType.READY
    v: int = spec(required(integer))
    session: str = spec(required(string))
    resume: str = spec(required(string))
    model: str = spec(required(string))
    capabilities: Capabilities = spec(required(nested(Capabilities)))
    limits: Limits = spec(required(nested(Limits)))
    engine: str | None = spec(optional(string), default=None)
    prompt_format: str | None = spec(optional(string), default=None)
    resumed: Resumed | None = spec(optional(nested(Resumed)), default=None)
    about: str | None = spec(optional(string), default=None)


@dataclass(frozen=True, slots=True)
class Configured(Frame):
    TYPE = FrameType.CONFIGURED


@dataclass(frozen=True, slots=True)
class ImageOk(Frame):
    TYPE = FrameType.IMAGE_OK
    id: str = spec(required(string))
    width: int = spec(required(integer))
    height: int = spec(required(integer))


@dataclass(frozen=True, slots=True)
class ResetOk(Frame):
    TYPE = FrameType.RESET_OK


@dataclass(frozen=True, slots=True)
class Rewound(Frame):
    TYPE = FrameType.REWOUND
    turns: int = spec(required(integer))


@dataclass(frozen=True, slots=True)
class Pong(Frame):
    TYPE = FrameType.PONG
    t: Any = spec(any_value, keep_nil=True, default=ABSENT)


@dataclass(frozen=True, slots=True)
class Queued(Frame):
    TYPE = FrameType.QUEUED
    id: str = spec(required(string))
    position: int = spec(required(integer))


@dataclass(frozen=True, slots=True)
class Start(Frame):
    TYPE = FrameType.START
    id: str = spec(required(string))
    prompt_tokens: int = spec(required(integer))
    cached_tokens: int = spec(required(integer))
    queued_ms: float = spec(required(number))


@dataclass(frozen=True, slots=True)
class TokenLogprobs(Record):
    """A ``token`` frame's logprobs (PROTOCOL.md section 7): for each token of the frame, in
    order, its id, its text alone, its bytes and its logprob, and ``top`` alternatives each,
    flat (token by token, most probable first), so a frame of many tokens is a few lists, not a
    map each."""

    ids: tuple[int, ...] = spec(required(int_list))
    tokens: tuple[str, ...] = spec(required(_str_items))
    token_bytes: tuple[bytes, ...] = spec(required(_bin_items))
    logprobs: tuple[float, ...] = spec(required(_float_items))
    top: int = spec(required(integer))
    top_ids: tuple[int, ...] = spec(required(int_list))
    top_tokens: tuple[str, ...] = spec(required(_str_items))
    top_bytes: tuple[bytes, ...] = spec(required(_bin_items))
    top_logprobs: tuple[float, ...] = spec(required(_float_items))

    def __post_init__(self) -> None:
        n, top = len(self.ids), self.top
        if top < 0 or not len(self.tokens) == len(self.token_bytes) == len(self.logprobs) == n:
            raise BadFrame("logprobs' lists must hold one entry per token")
        tops = (self.top_ids, self.top_tokens, self.top_bytes, self.top_logprobs)
        if any(len(values) != n * top for values in tops):
            raise BadFrame("logprobs' top lists must hold top entries per token")

    @classmethod
    def joined(cls, parts: Sequence[TokenLogprobs]) -> TokenLogprobs:
        """Several frames' logprobs as one frame's (a merged or caught-up frame), each token
        with as many alternatives as the part with fewest."""
        top = min(part.top for part in parts)

        def tops(part: TokenLogprobs, values: tuple[Any, ...]) -> list[Any]:
            k = part.top
            return [v for i in range(len(part.ids)) for v in values[i * k : i * k + top]]

        return cls(
            tuple(i for part in parts for i in part.ids),
            tuple(t for part in parts for t in part.tokens),
            tuple(b for part in parts for b in part.token_bytes),
            tuple(v for part in parts for v in part.logprobs),
            top,
            tuple(v for part in parts for v in tops(part, part.top_ids)),
            tuple(v for part in parts for v in tops(part, part.top_tokens)),
            tuple(v for part in parts for v in tops(part, part.top_bytes)),
            tuple(v for part in parts for v in tops(part, part.top_logprobs)),
        )


@dataclass(frozen=True, slots=True)
class Token(Frame):
    TYPE = FrameType.TOKEN
    id: str = spec(required(string))
    text: str = spec(required(string))
    index: int = spec(required(integer))
    ids: tuple[int, ...] | None = spec(optional(int_list), default=None)
    logprobs: TokenLogprobs | None = spec(optional(nested(TokenLogprobs)), default=None)


@dataclass(frozen=True, slots=True)
class ToolCall(Frame):
    """A call the reply ``id`` makes, once it is whole: its place among the reply's calls
    (``index``, from 0), its id (for its result), the function and its arguments as JSON text."""

    TYPE = FrameType.TOOL_CALL
    id: str = spec(required(string))
    index: int = spec(required(integer))
    call_id: str = spec(required(string))
    name: str = spec(required(string))
    arguments: str = spec(required(string))


@dataclass(frozen=True, slots=True)
class Usage(Record):
    prompt_tokens: int = spec(required(integer))
    completion_tokens: int = spec(required(integer))
    cached_tokens: int = spec(required(integer))


@dataclass(frozen=True, slots=True)
class Timing(Record):
    queued_ms: float = spec(required(number))
    ttft_ms: float | None = spec(optional(number), keep_nil=True)
    decode_tokens_per_s: float = spec(required(number))
    total_ms: float = spec(required(number))


@dataclass(frozen=True, slots=True)
class Done(Frame):
    TYPE = FrameType.DONE
    id: str = spec(required(string))
    reason: FinishReason = spec(required(enum_of(FinishReason)))
    text: str = spec(required(string))
    usage: Usage = spec(required(nested(Usage)))
    timing: Timing = spec(required(nested(Timing)))
    # the 1-based index of the exchange the reply is in the conversation; nil when not kept
    turn: int | None = spec(optional(integer), keep_nil=True, default=None)


@dataclass(frozen=True, slots=True)
class Error(Frame):
    TYPE = FrameType.ERROR
    code: ErrorCode = spec(required(enum_of(ErrorCode)))
    message: str = spec(required(string))
    id: str | None = spec(optional(string), default=None)


@dataclass(frozen=True, slots=True)
class GoAway(Frame):
    TYPE = FrameType.GOAWAY
    in_ms: int = spec(required(integer))


# ``stats.history``'s series: what the dashboard charts, one sample a second
HISTORY_SERIES = ("tokens_per_s", "running", "queued", "sessions", "ttft_p50_ms", "ttft_p95_ms")


@dataclass(frozen=True, slots=True)
class Stats(Frame):
    """Dashboard snapshot, one a second on ``/v1/stats``; the first a socket gets carries the
    last minutes' samples (``history``)."""

    TYPE = FrameType.STATS
    sessions: int = spec(required(integer))
    running: int = spec(required(integer))
    queued: int = spec(required(integer))
    tokens_per_s: float = spec(required(number))
    ttft_p50_ms: float | None = spec(optional(number), keep_nil=True)
    ttft_p95_ms: float | None = spec(optional(number), keep_nil=True)
    cancellations: int = spec(required(integer))
    errors: dict[str, Any] = spec(required(mapping))
    kv_tokens: int | None = spec(optional(integer), keep_nil=True)
    model: str = spec(required(string))
    device: str = spec(required(string))
    uptime_s: float = spec(required(number))
    live: tuple[Any, ...] = spec(optional(value_list, ()), default=())
    kv_bytes: int | None = spec(optional(integer), default=None)
    kv_budget_bytes: int | None = spec(optional(integer), default=None)
    rewinds: int | None = spec(optional(integer), default=None)
    regenerates: int | None = spec(optional(integer), default=None)
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
    | ToolCall
    | Done
    | Error
    | GoAway
    | Stats
)

CLIENT_FRAMES: dict[FrameType, type[ClientFrame]] = {
    cls.TYPE: cls
    for cls in (Prompt, Image, Cancel, Reset, Ping, Configure, Rewind, Regenerate, ToolResults)
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
        ToolCall,
        Done,
        Error,
        GoAway,
        Stats,
    )
}

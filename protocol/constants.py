"""Wire constants of protocol version 1: frame types, error codes, finish reasons, close codes.

Each member carries a one-line explanation; PROTOCOL.md's tables list the same values and a test
checks that the two agree.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

VERSION = 1
SUBPROTOCOL = "wschat.v1"
BEARER_PREFIX = "bearer."
# PROTOCOL.md "Close codes": the one close reason with a meaning. A 1013 with exactly this reason
# says the model is loading (wait and retry); a 1013 with any other reason says the server is full.
MODEL_LOADING_REASON = "the model is still loading"


class FrameType(StrEnum):
    # client -> server
    PROMPT = "prompt"
    IMAGE = "image"
    CANCEL = "cancel"
    RESET = "reset"
    PING = "ping"
    CONFIGURE = "configure"
    # server -> client
    READY = "ready"
    CONFIGURED = "configured"
    IMAGE_OK = "image_ok"
    RESET_OK = "reset_ok"
    PONG = "pong"
    QUEUED = "queued"
    START = "start"
    TOKEN = "token"
    DONE = "done"
    ERROR = "error"
    GOAWAY = "goaway"
    STATS = "stats"


CLIENT_FRAME_TYPES = frozenset(
    {
        FrameType.PROMPT,
        FrameType.IMAGE,
        FrameType.CANCEL,
        FrameType.RESET,
        FrameType.PING,
        FrameType.CONFIGURE,
    }
)


class ErrorCode(StrEnum):
    BAD_FRAME = "bad_frame"
    INVALID_PARAMS = "invalid_params"
    BUSY = "busy"
    NOT_RUNNING = "not_running"
    TOO_LARGE = "too_large"
    BAD_IMAGE = "bad_image"
    UNSUPPORTED = "unsupported"
    CONTEXT_OVERFLOW = "context_overflow"
    OVERLOADED = "overloaded"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"


ERROR_CODE_EXPLANATIONS: dict[ErrorCode, str] = {
    ErrorCode.BAD_FRAME: "not msgpack, not a map, no or unknown type, or a wrongly typed id/text",
    ErrorCode.INVALID_PARAMS: "a field's value is wrong: unknown param, wrong type, out of range",
    ErrorCode.BUSY: "a generation is already running or queued in this session",
    ErrorCode.NOT_RUNNING: "cancel named an id that no generation of this session ever had",
    ErrorCode.TOO_LARGE: "a frame, an image or a prompt is over a limit",
    ErrorCode.BAD_IMAGE: "the image is not a PNG, JPEG, WebP or GIF, or does not decode",
    ErrorCode.UNSUPPORTED: "the loaded model cannot do this (e.g. images on a text-only model)",
    ErrorCode.CONTEXT_OVERFLOW: "the prompt's tokens cannot fit the context window",
    ErrorCode.OVERLOADED: "the server is at capacity or shutting down",
    ErrorCode.UNAUTHORIZED: "the connection's credentials are no longer valid",
    ErrorCode.INTERNAL: "the server failed; details are in its log, not on the wire",
}


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


FINISH_REASON_EXPLANATIONS: dict[FinishReason, str] = {
    FinishReason.STOP: "end-of-turn or end-of-sequence token, or a stop string",
    FinishReason.LENGTH: "max_new_tokens or the context limit",
    FinishReason.CANCELLED: "cancel, reset, disconnect or shutdown",
    FinishReason.ERROR: "the generation failed; an error frame came just before",
}


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013


CLOSE_CODE_EXPLANATIONS: dict[CloseCode, str] = {
    CloseCode.NORMAL: "normal closure (also the idle timeout)",
    CloseCode.GOING_AWAY: "server going away (shutdown)",
    CloseCode.POLICY_VIOLATION: "policy: auth, origin, abuse",
    CloseCode.MESSAGE_TOO_BIG: "frame too big",
    CloseCode.INTERNAL_ERROR: "internal error",
    CloseCode.TRY_AGAIN_LATER: "try again later (server full, or the model still loading)",
}

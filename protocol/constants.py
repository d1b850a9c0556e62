"""Wire constants of protocol version 1: frame types, error codes, finish reasons, close codes.

PROTOCOL.md's tables list the same values, each with its meaning, and a test checks that the two
agree (tests/protocol/test_spec_tables.py).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

VERSION = 1
# PROTOCOL.md "Transport": the one WebSocket path of a chat; a handshake on any other is a 404
CHAT_PATH = "/v1/chat"
SUBPROTOCOL = "wschat.v1"
BEARER_PREFIX = "bearer."
# PROTOCOL.md "Close codes": the one close reason with a meaning. A 1013 with exactly this reason
# says the model is loading (wait and retry); a 1013 with any other reason says the server is full.
MODEL_LOADING_REASON = "the model is still loading"
# PROTOCOL.md "Transport": the routing key a load balancer sticks on. A (re)connect names its
# session in the query (``?session=<id>``, never authority: the resume token decides), and the
# handshake's response names the session it got in a header, so a new session's key is learnt.
SESSION_PARAM = "session"
SESSION_HEADER = "wschat-session"


class FrameType(StrEnum):
    # client -> server
    PROMPT = "prompt"
    IMAGE = "image"
    CANCEL = "cancel"
    RESET = "reset"
    PING = "ping"
    CONFIGURE = "configure"
    REWIND = "rewind"
    REGENERATE = "regenerate"
    TOOL_RESULTS = "tool_results"
    # server -> client
    READY = "ready"
    CONFIGURED = "configured"
    IMAGE_OK = "image_ok"
    RESET_OK = "reset_ok"
    REWOUND = "rewound"
    PONG = "pong"
    QUEUED = "queued"
    START = "start"
    TOKEN = "token"
    TOOL_CALL = "tool_call"
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
        FrameType.REWIND,
        FrameType.REGENERATE,
        FrameType.TOOL_RESULTS,
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
    INTERNAL = "internal"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CANCELLED = "cancelled"
    ERROR = "error"


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013

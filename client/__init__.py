"""The bundled wschat client: an asyncio library and the ``wschat`` command.

async with connect("ws://127.0.0.1:8000/v1/chat") as chat:
    async for piece in chat.prompt("The capital of France is", max_new_tokens=32):
        print(piece, end="", flush=True)
"""

from wschat.protocol import Done, FinishReason

from .api import Chat
from .errors import (
    BadFrameError,
    BadImageError,
    BusyError,
    ChatError,
    ClientError,
    ConnectError,
    ConnectionClosedError,
    ContextOverflowError,
    InternalError,
    InvalidParamsError,
    ModelLoadingError,
    NoChatEndpointError,
    NotListeningError,
    NotRunningError,
    NotServingYetError,
    OverloadedError,
    ReplyLostError,
    TooLargeError,
    UnsupportedError,
    error_from_frame,
)
from .images import ImageInput
from .opening import connect
from .reply import Reply
from .tools import CallRequest, ToolLoop

__all__ = [
    "BadFrameError",
    "BadImageError",
    "BusyError",
    "CallRequest",
    "Chat",
    "ChatError",
    "ClientError",
    "ConnectError",
    "ConnectionClosedError",
    "ContextOverflowError",
    "Done",
    "FinishReason",
    "ImageInput",
    "InternalError",
    "InvalidParamsError",
    "ModelLoadingError",
    "NoChatEndpointError",
    "NotListeningError",
    "NotRunningError",
    "NotServingYetError",
    "OverloadedError",
    "Reply",
    "ReplyLostError",
    "TooLargeError",
    "ToolLoop",
    "UnsupportedError",
    "connect",
    "error_from_frame",
]

"""Token producers: the engine interface (``base``), what engines refuse or fail with
(``errors``), the conversation as token ids (``history``, ``formats``: no torch) and the engines
that run a transformers model in this process (``local``: all the torch)."""

from .base import (
    CancelFlag,
    Chat,
    Engine,
    EngineInfo,
    Finished,
    Generation,
    GenerationRequest,
    KVUsage,
    PreparedTurn,
    SamplingParams,
    TextPieces,
    TokenPiece,
    Turn,
)
from .errors import (
    ContextExhausted,
    ConversationTooLong,
    EngineError,
    EngineFailed,
    EngineOverloaded,
    GenerationFailure,
    ImagesUnsupported,
    PromptTooLong,
    TurnRefused,
)

__all__ = [
    "CancelFlag",
    "Chat",
    "ContextExhausted",
    "ConversationTooLong",
    "Engine",
    "EngineError",
    "EngineFailed",
    "EngineInfo",
    "EngineOverloaded",
    "Finished",
    "Generation",
    "GenerationFailure",
    "GenerationRequest",
    "ImagesUnsupported",
    "KVUsage",
    "PreparedTurn",
    "PromptTooLong",
    "SamplingParams",
    "TextPieces",
    "TokenPiece",
    "Turn",
    "TurnRefused",
]

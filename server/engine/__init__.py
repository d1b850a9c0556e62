"""Token producers: the engine interface (``base``), what engines refuse (``errors``), the
conversation as token ids (``history``, ``formats``: no torch) and the engines that run a
transformers model in this process (``local``: all the torch)."""

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
    TokenPiece,
    Turn,
)
from .errors import ContextOverflow, EngineError, ImagesUnsupported, TooLarge

__all__ = [
    "CancelFlag",
    "Chat",
    "ContextOverflow",
    "Engine",
    "EngineError",
    "EngineInfo",
    "Finished",
    "Generation",
    "GenerationRequest",
    "ImagesUnsupported",
    "KVUsage",
    "PreparedTurn",
    "SamplingParams",
    "TokenPiece",
    "TooLarge",
    "Turn",
]

"""Token producers: the engine interface and its implementations."""

from .base import (
    CancelFlag,
    Engine,
    EngineInfo,
    Finished,
    Generation,
    GenerationRequest,
    SamplingParams,
    TokenPiece,
)

__all__ = [
    "CancelFlag",
    "Engine",
    "EngineInfo",
    "Finished",
    "Generation",
    "GenerationRequest",
    "SamplingParams",
    "TokenPiece",
]

"""An engine's HTTP failures as ``GenerationFailure`` (engine/errors.py):

- a prompt the engine's context cannot hold: ``ContextExhausted``;
- 429, 503, or an engine that cannot be reached: ``EngineOverloaded``, with when to retry;
- anything else, and an answer we cannot use (a number out of range, a line or text over its
  byte limit): ``EngineFailed``. The engine's own message is the ``detail`` (logged, never
  sent to clients).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ContextExhausted, EngineFailed, EngineOverloaded, GenerationFailure

DEFAULT_RETRY_S = 1.0
# what an engine's Retry-After may ask for at most (a larger one is taken as this)
MAX_RETRY_S = 600.0
_OVERLOAD_STATUSES = frozenset({429, 503})


def engine_message(body: bytes) -> str:
    """What the engine said, from an OpenAI-style error body (``{"error": {"message"}}``,
    vLLM's older ``{"message"}``) or the raw text."""
    text = body.decode(errors="replace")[:2000]
    try:
        decoded: Any = json.loads(text)
    except ValueError:
        return text
    if isinstance(decoded, dict):
        error = decoded.get("error", decoded)
        if isinstance(error, dict):
            kind = error.get("type")
            message = str(error.get("message", text))
            return f"{kind}: {message}" if kind else message
    return text


def _is_context_overflow(status: int, message: str) -> bool:
    lowered = message.lower()
    return status == 400 and (
        "exceed_context_size" in lowered  # llama.cpp's server
        or "maximum context length" in lowered  # vLLM
        or ("context" in lowered and ("exceed" in lowered or "too long" in lowered))
        or "longer than the model's context length" in lowered  # SGLang
    )


def retry_after_s(header: str | None) -> float:
    try:
        seconds = float(header) if header else DEFAULT_RETRY_S
    except ValueError:
        return DEFAULT_RETRY_S
    if seconds != seconds:  # NaN
        return DEFAULT_RETRY_S
    return min(max(seconds, 0.0), MAX_RETRY_S)


def failure_from_status(
    status: int, body: bytes, retry_after: str | None = None
) -> GenerationFailure:
    message = engine_message(body)
    if _is_context_overflow(status, message):
        return ContextExhausted(
            "the conversation does not fit the engine's context (reset to start afresh)",
            detail=f"HTTP {status}: {message}",
        )
    if status in _OVERLOAD_STATUSES:
        return overloaded(f"HTTP {status}: {message}", retry_after_s(retry_after))
    return EngineFailed("the engine failed to generate", detail=f"HTTP {status}: {message}")


def overloaded(detail: str, retry_s: float = DEFAULT_RETRY_S) -> EngineOverloaded:
    return EngineOverloaded.retry_in("the engine is busy or unreachable", retry_s, detail=detail)


def lost(detail: str) -> EngineFailed:
    """The engine went away mid-reply."""
    return EngineFailed("the engine stopped mid-reply", detail=detail)


def bad_answer(detail: str) -> EngineFailed:
    """The engine answered what we cannot use: a number out of range, a value of the wrong type,
    a line or a text over its byte limit. ``detail`` says which, never the whole of it."""
    return EngineFailed("the engine gave an answer that cannot be used", detail=detail)

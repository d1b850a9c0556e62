"""A chunk's values, checked for their type (and a count for its range) as a dialect reads them:
a wrong one is a bad answer (``errors.bad_answer``), never a number passed on to a frame."""

from __future__ import annotations

from typing import Any

from .errors import bad_answer, lost

# the largest count a chunk may give (cached prompt tokens): far over any context
MAX_COUNT = (1 << 31) - 1


def text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_answer(f"a text that is a {type(value).__name__}")
    return value


def ids(value: Any) -> list[int]:
    """Token ids: ints (the engine's vocabulary is checked where it is known, the engine)."""
    listed = items(value, "ids")
    if not all(type(i) is int for i in listed):
        raise bad_answer("token ids that are not all integers")
    return listed


def count(value: Any, name: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise bad_answer(f"{name} {short(value)}, not a count")
    return value


def finish(value: Any) -> str | None:
    """A finish reason; ``abort``: the engine gave the reply up (SGLang and vLLM say so)."""
    if value is not None and not isinstance(value, str):
        raise bad_answer(f"a finish reason that is a {type(value).__name__}")
    if value == "abort":
        raise lost("the engine aborted the reply")
    return value or None


def items(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_answer(f"{name} that is a {type(value).__name__}, not a list")
    return value


def fields(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_answer(f"{name} that is a {type(value).__name__}, not an object")
    return value


def short(value: Any) -> str:
    """A value for the log, cut short: an engine's answer may be of any size."""
    shown = repr(value)
    return shown if len(shown) <= 40 else f"{shown[:40]}..."

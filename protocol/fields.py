"""Exact field checks shared by frames and params (PROTOCOL.md "Transport": a bool is never a
number, an int field takes only ints, NaN and infinities are refused)."""

from __future__ import annotations

import math
from typing import TypeGuard

from .errors import BadFrame, InvalidParams, ProtocolError

MAX_ID_CHARS = 64


def is_int(value: object) -> TypeGuard[int]:
    return type(value) is int


def is_number(value: object) -> TypeGuard[int | float]:
    return (type(value) is int or type(value) is float) and math.isfinite(value)


def as_float(value: object, name: str, error: type[ProtocolError] = InvalidParams) -> float:
    if not is_number(value):
        raise error(f"{name} must be a finite number")
    return float(value)


def as_int(value: object, name: str, error: type[ProtocolError] = InvalidParams) -> int:
    if not is_int(value):
        raise error(f"{name} must be an integer")
    return value


def as_str(value: object, name: str, error: type[ProtocolError] = BadFrame) -> str:
    if type(value) is not str:
        raise error(f"{name} must be a string")
    return value


def as_bool(value: object, name: str, error: type[ProtocolError] = InvalidParams) -> bool:
    if type(value) is not bool:
        raise error(f"{name} must be a boolean")
    return value


def as_bytes(value: object, name: str, error: type[ProtocolError] = BadFrame) -> bytes:
    if type(value) is not bytes:
        raise error(f"{name} must be binary (msgpack bin)")
    return value


def as_id(value: object, name: str = "id") -> str:
    text = as_str(value, name)
    if not 1 <= len(text) <= MAX_ID_CHARS:
        raise BadFrame(f"{name} must be 1 to {MAX_ID_CHARS} characters")
    return text


def as_series(
    value: object, name: str, keys: tuple[str, ...]
) -> dict[str, tuple[float | None, ...]]:
    """A map of ``keys`` (each present; others ignored) to lists of equal length of numbers or
    nil: samples in columns (``stats.history``)."""
    if not isinstance(value, dict):
        raise BadFrame(f"{name} must be a map")
    series: dict[str, tuple[float | None, ...]] = {}
    for key in keys:
        column = value.get(key)
        if type(column) is not list:
            raise BadFrame(f"{name}.{key} must be a list")
        series[key] = tuple(
            None if v is None else as_float(v, f"{name}.{key}", BadFrame) for v in column
        )
    if len({len(column) for column in series.values()}) > 1:
        raise BadFrame(f"{name}'s lists must be of one length")
    return series

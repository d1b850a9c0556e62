"""Sampling parameters: the ``params`` map of ``prompt`` and ``configure`` (PROTOCOL.md "params").

The server clamps nothing silently: an unknown key, a wrong type or a value out of range is
``invalid_params``. ``max_new_tokens`` is range-checked against the server's limit by the
session, which knows it; here it must be a positive int.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import InvalidParams
from .fields import as_bool, as_float, as_int, as_str
from .response_format import OutputFormat, parse_response_format
from .tools import ToolChoice, ToolSpec, parse_tool_choice, parse_tools

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
MAX_LOGPROBS = 20  # the most top alternatives a token's logprobs list (OpenAI's and vLLM's cap)


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Every field optional: None means "use the session's, then the server's default"."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    token_ids: bool | None = None
    # the functions a reply may call, and how (tools.py); an empty list offers none
    tools: tuple[ToolSpec, ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # the reply's shape (response_format.py); type "text" sets no constraint
    response_format: OutputFormat | None = None
    # each token's logprob and this many most probable alternatives (0 .. MAX_LOGPROBS)
    logprobs: int | None = None

    def merged_over(self, base: GenerationParams) -> GenerationParams:
        """These params, with unset fields taken from ``base``."""
        changes = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(base, **{k: v for k, v in changes.items() if v is not None})

    def to_wire(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {k: v for k, v in out.items() if v is not None}
        if "stop" in out:
            out["stop"] = list(out["stop"])
        if "tools" in out:
            out["tools"] = [tool.to_wire() for tool in out["tools"]]
        if "tool_choice" in out:
            out["tool_choice"] = out["tool_choice"].to_wire()
        if "response_format" in out:
            out["response_format"] = out["response_format"].to_wire()
        return out


def _in_range(name: str, value: float, low: float, high: float, low_open: bool = False) -> None:
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        left = "(" if low_open else "["
        raise InvalidParams(f"{name} must be in {left}{low:g}, {high:g}]")


def _max_new_tokens(value: object) -> int:
    n = as_int(value, "max_new_tokens")
    if n < 1:
        raise InvalidParams("max_new_tokens must be at least 1")
    return n


def _temperature(value: object) -> float:
    t = as_float(value, "temperature")
    _in_range("temperature", t, 0.0, 2.0)
    return t


def _top_p(value: object) -> float:
    p = as_float(value, "top_p")
    _in_range("top_p", p, 0.0, 1.0, low_open=True)
    return p


def _top_k(value: object) -> int:
    k = as_int(value, "top_k")
    if k < 0:
        raise InvalidParams("top_k must be >= 0")
    return k


def _min_p(value: object) -> float:
    p = as_float(value, "min_p")
    _in_range("min_p", p, 0.0, 1.0)
    return p


def _repetition_penalty(value: object) -> float:
    r = as_float(value, "repetition_penalty")
    _in_range("repetition_penalty", r, 0.0, 2.0, low_open=True)
    return r


def _stop(value: object) -> tuple[str, ...]:
    if type(value) is not list:
        raise InvalidParams("stop must be a list of strings")
    if len(value) > MAX_STOP_STRINGS:
        raise InvalidParams(f"stop takes at most {MAX_STOP_STRINGS} strings")
    out = []
    for item in value:
        text = as_str(item, "stop", InvalidParams)
        if not 1 <= len(text) <= MAX_STOP_CHARS:
            raise InvalidParams(f"each stop string must be 1 to {MAX_STOP_CHARS} characters")
        out.append(text)
    return tuple(out)


def _seed(value: object) -> int:
    seed = as_int(value, "seed")
    if not -(2**63) <= seed < 2**64:
        raise InvalidParams("seed must fit in 64 bits")
    return seed


def _token_ids(value: object) -> bool:
    return as_bool(value, "token_ids")


def _logprobs(value: object) -> int:
    n = as_int(value, "logprobs")
    if not 0 <= n <= MAX_LOGPROBS:
        raise InvalidParams(f"logprobs must be in [0, {MAX_LOGPROBS}]")
    return n


_CHECKS: dict[str, Callable[[object], Any]] = {
    "max_new_tokens": _max_new_tokens,
    "temperature": _temperature,
    "top_p": _top_p,
    "top_k": _top_k,
    "min_p": _min_p,
    "repetition_penalty": _repetition_penalty,
    "stop": _stop,
    "seed": _seed,
    "token_ids": _token_ids,
    "tools": parse_tools,
    "tool_choice": parse_tool_choice,
    "parallel_tool_calls": lambda value: as_bool(value, "parallel_tool_calls"),
    "response_format": parse_response_format,
    "logprobs": _logprobs,
}
assert set(_CHECKS) == {f.name for f in fields(GenerationParams)}


def parse_params(value: object) -> GenerationParams:
    """The wire ``params`` map as ``GenerationParams``, or ``InvalidParams``."""
    if not isinstance(value, Mapping):
        raise InvalidParams("params must be a map")
    checked: dict[str, Any] = {}
    for key, raw in value.items():
        check = _CHECKS.get(key) if type(key) is str else None
        if check is None:
            raise InvalidParams(f"unknown parameter {key!r}")
        if raw is not None:
            checked[key] = check(raw)
    return GenerationParams(**checked)

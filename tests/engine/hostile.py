"""Sampling parameters inside PROTOCOL.md "params" ranges, each at an edge where float32 math
overflows (a temperature or penalty near zero divides logits into infinities) or divides zero by
zero (a positive value that rounds to 0.0 in float32)."""

from __future__ import annotations

from typing import Any

HOSTILE_PARAMS: list[dict[str, Any]] = [
    {"temperature": 1e-45},
    {"temperature": 5e-324, "top_k": 5},
    {"temperature": 1.0, "repetition_penalty": 1e-300},
    {"temperature": 2.0, "repetition_penalty": 5e-324, "top_p": 1e-300},
    {"repetition_penalty": 1e-300},
    {"temperature": 1e-300, "top_p": 0.5, "top_k": 2**40, "repetition_penalty": 2.0},
]

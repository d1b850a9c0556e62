"""The JSON schema the structured-output tests hold replies to, in process and in front of
llama.cpp: every value bounded, so that even a random model's reply ends, and the schema says
where."""

from __future__ import annotations

from typing import Any

BOUNDED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["colour", "count", "ok"],
    "additionalProperties": False,
}

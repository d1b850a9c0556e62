"""``params.response_format``: the shape of a reply (PROTOCOL.md "params"), OpenAI's own.

    {type: "text"}                                       no constraint (a session default's off)
    {type: "json_object"}                                any JSON object
    {type: "json_schema", json_schema: {name?, description?, schema, strict?}}

A schema is held to the caps a tool's schemas are (tools.py ``check_schema_size``) before any
grammar is built from it, so that what a client sends bounds the work; the walk that counts
stops at the first cap it passes, so a refused schema costs no more than an accepted one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidParams
from .fields import as_bool, as_str
from .tools import check_schema_size

TEXT, JSON_OBJECT, JSON_SCHEMA = "text", "json_object", "json_schema"
TYPES = (TEXT, JSON_OBJECT, JSON_SCHEMA)
MAX_NAME_CHARS = 64
_KEYS = frozenset({"type", JSON_SCHEMA})
_SCHEMA_KEYS = frozenset({"name", "description", "schema", "strict"})


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """A checked ``response_format``: its ``type``, and for ``json_schema`` its schema (a map),
    whether it is ``strict`` and its ``name`` ("" when none came)."""

    type: str = TEXT
    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    strict: bool = False
    name: str = ""
    # the schema as compact JSON with sorted keys: what equality and hashing read
    key: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        text = "" if self.schema is None else json.dumps(self.schema, sort_keys=True)
        object.__setattr__(self, "key", text)

    @property
    def constrained(self) -> bool:
        return self.type != TEXT

    def to_wire(self) -> dict[str, Any]:
        if self.type != JSON_SCHEMA:
            return {"type": self.type}
        spec: dict[str, Any] = {"name": self.name} if self.name else {}
        spec |= {"schema": self.schema, "strict": self.strict}
        return {"type": self.type, JSON_SCHEMA: spec}


def parse_response_format(value: object) -> OutputFormat:
    """The wire ``response_format`` map, checked, or ``InvalidParams`` naming what is wrong."""
    if not isinstance(value, Mapping):
        raise InvalidParams("response_format must be a map")
    _known(value, _KEYS, "response_format")
    kind = value.get("type")
    if kind not in TYPES:
        raise InvalidParams(f"response_format.type must be one of {', '.join(TYPES)}")
    spec = value.get(JSON_SCHEMA)
    if kind != JSON_SCHEMA:
        if spec is not None:
            raise InvalidParams(f"response_format.json_schema goes with type {JSON_SCHEMA}")
        return OutputFormat(kind)
    where = "response_format.json_schema"
    if not isinstance(spec, Mapping):
        raise InvalidParams(f"{where} must be a map")
    _known(spec, _SCHEMA_KEYS, where)
    name = spec.get("name")
    name = "" if name is None else as_str(name, f"{where}.name", InvalidParams)
    if len(name) > MAX_NAME_CHARS:
        raise InvalidParams(f"{where}.name must be at most {MAX_NAME_CHARS} characters")
    if spec.get("description") is not None:
        as_str(spec["description"], f"{where}.description", InvalidParams)
    strict = spec.get("strict")
    strict = False if strict is None else as_bool(strict, f"{where}.strict")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise InvalidParams(f"{where}.schema must be a map (a JSON schema)")
    check_schema_size(schema, f"{where}.schema")
    return OutputFormat(kind, dict(schema), strict, name)


def _known(value: Mapping[Any, Any], keys: frozenset[str], where: str) -> None:
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise InvalidParams(f"unknown key {unknown[0]!r} in {where}")

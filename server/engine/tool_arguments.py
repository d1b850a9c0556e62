"""A call's arguments checked against its tool's ``parameters`` (a JSON schema), with
``jsonschema``: the rule every engine's calls keep. In this process the tool grammar
(tool_grammar.py) lets a call be written only as its schema says, bar the keywords llguidance
does not implement (it skips those: the tools' schemas are compiled lenient); an engine over HTTP
is sent a forced call's schema to enforce, and an ``auto`` reply's none. Every call is checked
here, so what a client is sent matches, on every engine.

Every tool's schema is enforced whole, whatever its ``strict`` said (OpenAI's ``strict`` is not
read: every engine holds every call to its schema, one promise for every client). A schema that
is not one (``check_schema``), or whose ``$ref`` points outside it (no reference is ever
fetched), cannot be kept: a call to such a tool fails as a mismatch does.

The check runs on the event loop and a tool's schema is the client's, so its ``pattern`` and
``patternProperties`` are matched with ``regex`` under one time budget per call: a pattern that
backtracks without end (``^(a+)+$`` against a near miss) fails the call instead of stalling every
session, as Python's ``re`` (``jsonschema``'s own) would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import referencing.exceptions
import regex
from jsonschema import validators

from .errors import CallArgumentsInvalid

# the most of the validator's words a client is shown: they may quote the arguments
_SHOWN_CHARS = 200
# the time one call's patterns may take in all (a call's strings are a reply's few KB: a sane
# pattern takes microseconds)
PATTERN_BUDGET_S = 0.05


class _PatternTimeout(Exception):
    """A pattern ran past the call's budget."""


class _Patterns:
    """``regex`` searches of one check, against its deadline."""

    def __init__(self, budget_s: float) -> None:
        self._deadline = time.monotonic() + budget_s

    def search(self, pattern: str, text: str) -> bool:
        left = self._deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            return regex.search(pattern, text, timeout=left) is not None
        except TimeoutError:
            raise _PatternTimeout(pattern) from None
        except regex.error as e:
            raise jsonschema.exceptions.SchemaError(f"{pattern!r} is not a pattern: {e}") from None

    def pattern(self, validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not self.search(pattern, instance):
            yield jsonschema.exceptions.ValidationError(f"{instance!r} does not match {pattern!r}")

    def pattern_properties(
        self, validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for pattern, subschema in properties.items():
            for key, value in instance.items():
                if self.search(pattern, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def check_arguments(name: str, schema: Mapping[str, Any] | None, arguments: Any) -> None:
    """``CallArgumentsInvalid`` when ``arguments`` do not match ``schema`` (None: any object),
    its message the first mismatch ``jsonschema`` reports (the best of them) and where."""
    if schema is None:
        return
    problem = _mismatch(schema, arguments)
    if problem is not None:
        raise CallArgumentsInvalid(
            f"the engine called {name} with arguments that do not match its parameters: "
            + problem[:_SHOWN_CHARS]
        )


def _mismatch(schema: Mapping[str, Any], arguments: Any) -> str | None:
    draft = validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    patterns = _Patterns(PATTERN_BUDGET_S)
    checker = validators.extend(
        draft, {"pattern": patterns.pattern, "patternProperties": patterns.pattern_properties}
    )
    try:
        draft.check_schema(schema)
        error = jsonschema.exceptions.best_match(checker(schema).iter_errors(arguments))
    except jsonschema.exceptions.SchemaError as e:
        return f"they are not a JSON schema: {e.message}"
    except referencing.exceptions.Unresolvable as e:
        return f"a reference they make is not in them: {e}"
    except _PatternTimeout as e:
        return f"matching them against the pattern {e.args[0]!r} took too long"
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{error.message} (at {where})" if where else error.message

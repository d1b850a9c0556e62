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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
import referencing.exceptions
from jsonschema import validators

from .errors import CallArgumentsInvalid

# the most of the validator's words a client is shown: they may quote the arguments
_SHOWN_CHARS = 200


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
    checker = validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        checker.check_schema(schema)
        error = jsonschema.exceptions.best_match(checker(schema).iter_errors(arguments))
    except jsonschema.exceptions.SchemaError as e:
        return f"they are not a JSON schema: {e.message}"
    except referencing.exceptions.Unresolvable as e:
        return f"a reference they make is not in them: {e}"
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{error.message} (at {where})" if where else error.message

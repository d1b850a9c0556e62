"""A request's body as the API reads it: sent as JSON (``Content-Type: application/json``, else
415), its bytes within the size limit (413), then JSON, refused (400) where it is not JSON,
nests deeper than the parser goes, or holds a string that is not text (a lone UTF-16
surrogate, ``"\\ud800"``: valid JSON, but no UTF-8 encodes it, and every later step that
encodes it would fail).

json's C parser holds the GIL from the first byte to the last: a 10 MiB body of small objects
or numbers held the event loop for half a second to two. A body over ``INLINE_BYTES`` is
parsed in the engine's worker thread for text work (``TextTokenizer.run``, one at a time for
the whole server) with Python hooks for objects and numbers, each a point where that thread
hands the GIL to the event loop when it waits, so the loop runs every few milliseconds.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from starlette.requests import Request

from ...engine import Engine
from .errors import ApiError

JSON_MEDIA_TYPE = "application/json"
# Parsed on the loop at once: well under a millisecond of work.
INLINE_BYTES = 64 * 1024
# How a surrogate gets into a JSON text (raw UTF-8 cannot hold one): a body without such an
# escape needs no look at its strings
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # what is left once json joined the pairs


async def json_body(request: Request, limit: int, engine: Engine) -> Any:
    """The body parsed as JSON: 415 unless it is sent as JSON (before it is read), 413 past
    ``limit`` bytes, 400 when it is not JSON."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        # as vLLM: a form or a text is not taken for JSON (nor is a body with no type), so a
        # page's plain form post, which a browser sends without a preflight, is never run
        message = f"the request body must be JSON, sent with Content-Type: {JSON_MEDIA_TYPE}"
        raise ApiError(message, status=415, code="unsupported_media_type")
    return await parse_json(await _read(request, limit), engine)


async def parse_json(data: bytes | bytearray, engine: Engine) -> Any:
    """``data`` parsed as JSON, a large one in the engine's worker thread for text work; 400
    when it is not JSON (or holds a string that is not text)."""
    if len(data) <= INLINE_BYTES:
        return _parsed(data, json.loads)
    return await engine.text_tokenizer.run(functools.partial(_parsed, data, _loads), len(data))


async def _read(request: Request, limit: int) -> bytearray:
    declared = request.headers.get("content-length", "")
    too_large = ApiError(f"the request body is over {limit} bytes", status=413, code="too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()  # one buffer, grown as the body arrives: never a second copy of it
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise too_large
        body += chunk
    return body


def _parsed(data: bytes | bytearray, loads: Any) -> Any:
    try:
        value = loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ApiError("the request body is not JSON", code="invalid_params") from None
    except RecursionError:
        raise ApiError("the request body nests too deeply", code="invalid_params") from None
    if _SURROGATE_ESCAPE.search(data) and _holds_surrogate(value):
        message = "a string in the request body holds a lone UTF-16 surrogate: it is not text"
        raise ApiError(message, code="invalid_params")
    return value


def _holds_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (keys included) holds a lone surrogate; iterative, so that
    the deepest value json parsed is no deeper here."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list):
            pending += item
    return False


def _loads(data: bytes | bytearray) -> Any:
    """``json.loads``, with a Python call per object and number: the thread can let go of the
    GIL there (json's own C path never does)."""
    return json.loads(data, object_pairs_hook=_object, parse_int=_int, parse_float=_float)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    return float(text)

"""The API's errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

A refusal keeps the wire code a WebSocket client would get for the same thing as its ``code``
(``invalid_params``, ``too_large``, ...), except a conversation over the context, which is
``context_length_exceeded`` as OpenAI spells it (tools look for that one). The HTTP status
follows the code: the peer's fault 400 (413 over a size limit, 415 for a body that is not
sent as JSON), capacity 429 with ``Retry-After``, ours 500; an unknown URL or model is 404.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from wschat.protocol import Error, ErrorCode, InvalidParams, Unsupported

from ...sessions import error_frame
from ..access import Refusal

log = logging.getLogger("wschat.openai_api")

Endpoint = Callable[[Request], Awaitable[Response]]

# A full queue or a busy engine: a retry this soon after is likely to find room.
RETRY_AFTER_S = 1

_STATUS: dict[ErrorCode, int] = {
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.INTERNAL: 500,
}
_TYPE: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",  # OpenAI's, for an unknown URL or model
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}
_CODE = {ErrorCode.CONTEXT_OVERFLOW: "context_length_exceeded"}


class ApiError(Exception):
    """A request refused before anything ran, or a reply that failed."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        # the wire code it stands for, counted as a WebSocket error frame is
        self.wire: ErrorCode | None = None

    @classmethod
    def of(cls, error: BaseException, param: str | None = None) -> ApiError:
        """Any failure as the session would frame it (error_boundary.py), in the API's shape."""
        if isinstance(error, ApiError):
            return error
        return cls.of_frame(error_frame(error), param)

    @classmethod
    def of_frame(cls, frame: Error, param: str | None = None) -> ApiError:
        code = ErrorCode(frame.code)
        status = _STATUS.get(code, 400)
        error = cls(frame.message, status=status, param=param, code=_CODE.get(code, code.value))
        error.wire = code
        return error

    def body(self) -> dict[str, Any]:
        kind = _TYPE.get(self.status, "invalid_request_error")
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }

    def response(self) -> JSONResponse:
        retry = self.status in (429, 503)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else {}
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def guarded(endpoint: Endpoint) -> Endpoint:
    """``endpoint``, whose failure of ours is answered as any other error: 500 ``internal`` in
    OpenAI's shape with a generic message (error_boundary.py), its traceback logged only."""

    @functools.wraps(endpoint)
    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as error:
            log.exception("%s %s failed", request.method, request.url.path)
            return ApiError.of(error).response()

    return answer


async def unknown_path(request: Request) -> Response:
    """Any other request under ``/v1/``: 404 in OpenAI's shape, as OpenAI answers it."""
    path = request.url.path
    shown = path if len(path) <= 80 else path[:79] + "…"
    message = f"Invalid URL ({request.method} {shown})"
    return ApiError(message, status=404, code="unknown_url").response()


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError.of(InvalidParams(message), param)


def unsupported(message: str, param: str) -> ApiError:
    return ApiError.of(Unsupported(message), param)


_REFUSALS = {
    Refusal.FOREIGN_HOST: (403, "this Host is not served here (--allowed-host)", "forbidden"),
    Refusal.FOREIGN_ORIGIN: (403, "this Origin may not connect", "forbidden"),
    Refusal.NO_TOKEN: (401, "a bearer token is required (Authorization: Bearer TOKEN)", None),
    Refusal.WRONG_TOKEN: (401, "the bearer token is not one this server accepts", None),
}


def refusal_error(why: Refusal) -> ApiError:
    status, message, code = _REFUSALS[why]
    return ApiError(message, status=status, code=code or "invalid_api_key")

"""The HTTP side of the openai engine: one ``httpx`` client per engine, server-sent events in,
failures out as ``GenerationFailure`` (``errors``).

Nothing an engine sends is held whole beyond a bound: a line of its stream is read up to
``max_line`` bytes, an error body up to ``ERROR_BODY_BYTES`` (for the log); a line over its limit
ends the reply as a bad answer and closes the stream. Replies are asked for uncompressed, and a
compressed one is refused, so that a few bytes cannot unpack into many.

``api_url`` is the OpenAI base (``http://host:port/v1``); ``/tokenize`` and ``/health`` live at
the server's root on both llama.cpp's server and vLLM. The API key travels in a header and is
never logged (not even its length).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from .errors import bad_answer, failure_from_status, overloaded

log = logging.getLogger("wschat.engine.openai")

CONNECT_TIMEOUT_S = 5.0
# a reply may pause this long between chunks (a long prefill on a busy engine) before it is lost
READ_TIMEOUT_S = 300.0
HEALTH_TIMEOUT_S = 2.0
# what is read of an error's body: enough for its message in the log
ERROR_BODY_BYTES = 16 * 1024
# a line of a stream when the engine does not say otherwise (``stream``'s ``max_line``)
LINE_BYTES = 1 << 20


def split_url(url: str) -> tuple[str, str]:
    """(the API base, the server root): ``http://h:p/v1`` gives both; ``http://h:p`` too."""
    base = url.rstrip("/")
    root = base.removesuffix("/v1")
    return f"{root}/v1", root


class EngineHttp:
    def __init__(self, url: str, api_key: str | None) -> None:
        self._urls = split_url(url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._async: httpx.AsyncClient | None = None

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        return f"EngineHttp({self.api_url!r})"

    @property
    def api_url(self) -> str:
        return self._urls[0]

    @property
    def root_url(self) -> str:
        return self._urls[1]

    def move_to(self, url: str) -> None:
        """The engine is at ``url`` now (a supervised server restarted on another port); from
        any thread: the next request goes there."""
        self._urls = split_url(url)

    # -- at start, from the loading thread -------------------------------------------------

    def get_json(self, path: str, *, root: bool = False) -> Any:
        with httpx.Client(headers=self._headers, timeout=CONNECT_TIMEOUT_S) as client:
            response = client.get(f"{self.root_url if root else self.api_url}{path}")
            response.raise_for_status()
            return response.json()

    def post_json(self, path: str, body: dict[str, Any], *, root: bool = False) -> Any:
        with httpx.Client(headers=self._headers, timeout=CONNECT_TIMEOUT_S) as client:
            response = client.post(f"{self.root_url if root else self.api_url}{path}", json=body)
            response.raise_for_status()
            return response.json()

    # -- on the event loop ----------------------------------------------------------------

    @property
    def client(self) -> httpx.AsyncClient:
        if self._async is None:
            self._async = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                # one connection per running reply (and the health checks' one, kept)
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=8),
            )
        return self._async

    async def healthy(self) -> bool:
        try:
            response = await self.client.get(f"{self.root_url}/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def stream(
        self,
        path: str,
        body: dict[str, Any],
        session_key: str | None,
        max_line: int = LINE_BYTES,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The chunks of a streamed reply from ``path`` (from the server's root); leaving the
        iteration early (cancel, ``aclose``) closes the connection, which the engine takes as the
        request's abort. The stream ends at ``[DONE]`` or where the engine ends it; a line over
        ``max_line`` bytes, or one that is not a JSON object, is a bad answer.

        Each reply has a connection of its own, closed after it: llama.cpp's server may close
        a connection it streamed a reply on while the next request is being sent on it."""
        headers = {"Connection": "close", "Accept-Encoding": "identity"}
        if session_key:
            headers["X-Session-ID"] = session_key
        try:
            async with self.client.stream(
                "POST", f"{self.root_url}{path}", json=body, headers=headers
            ) as response:
                if response.status_code != 200:
                    raise failure_from_status(
                        response.status_code,
                        await _head(response, ERROR_BODY_BYTES),
                        response.headers.get("retry-after"),
                    )
                encoding = response.headers.get("content-encoding", "identity").lower()
                if encoding != "identity":
                    raise bad_answer(f"a reply encoded {encoding[:40]!r}, asked for none")
                async with contextlib.aclosing(_lines(response, max_line)) as lines:
                    async for line in lines:
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            return
                        yield _chunk(data)
        except httpx.ConnectError as error:
            raise overloaded(f"cannot reach {self.api_url}: {error}") from error

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None


def _chunk(data: bytes) -> dict[str, Any]:
    """One ``data:`` line's chunk: a JSON object; one that names an error is the engine's."""
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError) as error:  # not JSON; nested too deep to be a chunk
        raise bad_answer(f"a line that is not a JSON chunk: {type(error).__name__}") from None
    if not isinstance(chunk, dict):
        raise bad_answer(f"a chunk that is a {type(chunk).__name__}")
    if "error" in chunk:  # an error after the stream began
        raise failure_from_status(500, data)
    return chunk


async def _head(response: httpx.Response, limit: int) -> bytes:
    """Up to ``limit`` bytes of a body; the rest is never read (the connection is closed)."""
    head = bytearray()
    async for data in response.aiter_raw():
        head += data[: limit - len(head)]
        if len(head) >= limit:
            break
    return bytes(head)


async def _lines(response: httpx.Response, limit: int) -> AsyncGenerator[bytes, None]:
    """A body's lines (ended by ``\n`` or ``\r\n``), each at most ``limit`` bytes: a longer
    one is a bad answer, and no more of it is kept than the limit and one network read."""
    pending = bytearray()
    async for data in response.aiter_raw():
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            pending += data[start:end]
            if len(pending) > limit:
                break
            yield bytes(pending).removesuffix(b"\r")
            pending.clear()
            start = end + 1
        else:
            pending += data[start:]
        if len(pending) > limit:
            raise bad_answer(f"a line over {limit} bytes")
    if pending:
        yield bytes(pending)
